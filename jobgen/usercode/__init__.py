"""The user's code: immutable snapshots of it and the classes a spec names."""
