from tests.helpers.multinode_fixture import multinode_cluster  # noqa: F401  (session multi-node cluster)
