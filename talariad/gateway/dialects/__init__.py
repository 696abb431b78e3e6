"""One module per API, each a pair: its body parsed into a `CallSpec`, and an answer's events
rendered as its bytes (a stream of event lines, or one body). The lifecycle between the two is
`gateway/call.py`'s, the same for all."""
