// The tp x pp x dp grid arrives with the parallelism issue; one rank is the 1x1x1 grid.
