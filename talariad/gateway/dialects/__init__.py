"""One module per API: an answer's events rendered as its bytes (a stream of event lines, or one
body). Its body and the parse into a `CallSpec` are `calls/dialects/`'s; the lifecycle between
the two is `gateway/call.py`'s, the same for all."""
