"""Tests of deploy/: the systemd unit and the installer, with the real systemd tools."""
