"""What was used: counters, stored results, a subject's usage now and its history, and the
customer's usage page (the read side; `facade` is `Meter`'s part)."""
