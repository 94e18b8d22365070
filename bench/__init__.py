"""Every `kspec bench` command and `kspec eval`, the baselines they compare against, one statistics module."""
