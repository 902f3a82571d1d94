"""Training loops of other people's kind on longrun's public job-side API (training.api)."""
