"""Running a test function in N torch.distributed processes under the doctor (the pytest plugin's
engine): ``runner`` in the test process, ``spawn`` the launcher, ``zygote`` the fork server that
forks its ranks with torch already imported, ``worker`` in each rank."""
