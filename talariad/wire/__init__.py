"""What crosses between processes. One chat call, from HTTP body to lease:

    body ─ dialect ─▶ CallSpec ─ Call ─┬▶ CallRequest ─ router ─▶ Decision (instance)
                                        └▶ GenerateRequest ═ call stream ═▶ InstanceCall
    InstanceCall ─ scheduler, executor ─▶ TokenEvent… DoneEvent(usage, KVLocation's state, kv_len)
    DoneEvent ═▶ Call.finish ─▶ router.completed ─▶ Lease (τ) + the session's KV record

`messages.py` types the frames (═), `stream.py` frames them on a unix socket, `client.py` is the
one client of instance processes.
"""
