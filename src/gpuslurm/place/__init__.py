"""Pure placement engine: choose GPUs (or MIG devices) for a request, topology first, then load."""
