"""The in-rank agent: a daemon thread in each rank that answers the supervisor's requests.

It answers even while the rank's main thread is blocked inside a collective (``Work.wait`` releases
the GIL): its Python stacks (``stacks``) and a PyTorch Flight Recorder dump (``flight_recorder``).
``server`` runs inside the rank, ``client`` in the supervisor, ``protocol`` is what they share.
"""
