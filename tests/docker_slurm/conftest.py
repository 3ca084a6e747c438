from tests.helpers.docker_fixture import cluster_image, docker_engine, docker_node  # noqa: F401  (the docker-slurm image)
