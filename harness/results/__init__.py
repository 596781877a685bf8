"""The results record: schema (typed rows, versioned), metric declarations, the roofline, the results document."""
