"""Node state both schedulers share: job→GPU maps, the sample store, cgroup path → job."""
