"""What a call is, shared by the box's gateway and the pool's picker: the dialects' body models
and their parse into a `CallSpec` (one route table), the call's plan, its session and branch, and
the API error a refusal becomes. No HTTP server here: the gateway and the picker answer."""
