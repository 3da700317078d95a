"""What happened in a run: first-failure triage of its output and the device time it used."""
