"""What the data preparation and the training program share, and nothing else: the shard file
format, ownership of directories being written, which directories belong to which program
(``protected``), and the one command-line mechanism.

Both ``data_prep`` and ``mpifgl`` import this package; it imports neither of them."""
