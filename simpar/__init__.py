"""simpar: learn distributed deep-learning training by doing it for real, small.

NumPy on real MPI ranks; every byte between ranks counted and sorted into data, model and
activation traffic; every parallel layout checked against the serial run. See README.md.
"""

__version__ = "0.1.0"
