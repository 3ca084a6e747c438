"""OpenPBS / PBS Professional adapter: PBS's hook events and commands around the neutral core."""
