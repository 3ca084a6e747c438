"""Watch and act: the node monitor, its store, the exporter."""
