"""genie's supervisor daemon: client sockets, request queue, worker supervision."""
