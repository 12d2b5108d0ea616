"""How a run is started: the entry both doors call (``python train.py`` and ``mloc run``),
its CPU threads and progress display, and the runs of several processes (``--nproc``
workers under one supervisor; ``--pipeline``, one process per interlocking stage). The
runtime's top layer.
"""
