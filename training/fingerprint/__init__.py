"""Exact fingerprints of tensors: xxh3-64 over raw bytes on the host (`host`) and the integer-exact
device-side variant (`device`)."""
