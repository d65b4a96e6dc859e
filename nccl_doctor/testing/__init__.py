"""Running a test function in N torch.distributed processes under the doctor (the pytest plugin's
engine): ``runner`` in the test process, ``worker`` in each rank."""
