"""The daemon (``vlad serve``): the supervisor (:mod:`~vlad.daemon.supervisor`), its sockets
(:mod:`~vlad.daemon.sockets`), the e-stop thread (:mod:`~vlad.daemon.safety`), the policy
chain (:mod:`~vlad.daemon.chain`), the health service (:mod:`~vlad.daemon.health`), live
release operations (:mod:`~vlad.daemon.releases`), the control server and its commands
(:mod:`~vlad.daemon.control`), status (:mod:`~vlad.daemon.status`) and the systemd notify
protocol (:mod:`~vlad.daemon.systemd`); and the other side: ``vlad serve`` run as a child
process behind a notify socket of its own (:mod:`~vlad.daemon.child`: the gates, the demo).
Importing the package imports none of them."""
