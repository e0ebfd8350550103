"""What both servers (the node agent and the relay) and their clients share: listen
and token rules, TLS contexts (`security`), serving behind a connection guard
(`guard`), the viewer WebSocket handshake (`viewer_socket`), serving on a caller's loop
(`service`) and the guard's Prometheus counts (`metrics`)."""
