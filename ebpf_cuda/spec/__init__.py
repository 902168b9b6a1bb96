"""What is traced, as data: the API table and the fixed layouts the probes and the decoder share."""
