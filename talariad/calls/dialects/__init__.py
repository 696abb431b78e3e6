"""One module per API: its request body models and their parse into a `CallSpec`. The answer's
rendering, which needs the gateway's `Call`, is the gateway's (`gateway/dialects/`)."""
