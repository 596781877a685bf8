"""The timeout the CPU tests put on a short child process (a command, a lint, an inner pytest): a guard against
hangs, never a speed check. The long children (the Triton-interpreter reruns, the mutation runs, asv) keep 600 s.

CI's two cores are shared by two xdist workers whose children start their own; a child that takes 3 s on an idle
machine took over 120 s there (stop 41's CI: the binding-proof run), so the guard is generous.
"""

HANG_GUARD_S = 900
