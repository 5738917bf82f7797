"""Scripts run under mpirun by the tests in tests/mpi (not collected by pytest)."""
