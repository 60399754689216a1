"""What the stage-to-stage transfers cost a pipeline schedule, from its measured timelines.

``hop_costs(per_rank_steps)`` reads, from the timelines of pipeline_bubble.py (per rank, per
step, a list of (action, start, end) with time.perf_counter() stamps, one clock for every
process of a host), three numbers:
  - overrun: median of (compute action's duration - its nominal duration);
  - post: median duration of a send action (the sender's time to post it);
  - hop: median, over transfers whose receiver was already waiting when the send was posted,
    of (receive action's end - send action's end): delivery plus the receiver's wake-up and
    its work on the arrived message.

``replay(schedule, f_ms, overrun_ms, post_ms, hop_ms)`` runs the schedule's action lists (the
lists the ranks execute, hvdlite.parallel.schedules) in a discrete-event model: a compute
action takes its nominal time plus the overrun, a send costs its rank post_ms and its message
is there hop_ms after the post, a receive waits for its message. It returns the mean idle
fraction over ranks (1 - compute / makespan). With the measured costs it should land near the
measured idle; with smaller hops it tells what the same schedule gives on a machine whose
transfers cost that, and so which hop cost a goal needs.
"""

import statistics

from hvdlite.parallel import schedules


def nominal_ms(kind, f_ms, v):
    """Nominal duration of a compute action of pipeline_bubble's sleep stages (I = W = F,
    B = 2F; a rank's work split over its v stages)."""
    return {"F": f_ms, "B": 2 * f_ms, "I": f_ms, "W": f_ms}[kind] / v


def _transfer_key(action):
    """(direction, sending stage, microbatch): the same for a send and its receive."""
    if action.kind in ("SEND_F", "SEND_B"):
        return action.kind[-1], action.stage, action.mb
    sender = action.stage - 1 if action.kind == "RECV_F" else action.stage + 1
    return action.kind[-1], sender, action.mb


def hop_costs(per_rank_steps, f_ms, v):
    """(overrun_ms, post_ms, hop_ms) medians over every step of every rank (see the module)."""
    overrun, post, hop = [], [], []
    for k in range(len(per_rank_steps[0])):
        sends, recvs = {}, {}
        for timeline in per_rank_steps:
            for action, start, end in timeline[k]:
                if action.kind in schedules.COMPUTE:
                    overrun.append((end - start) * 1e3 - nominal_ms(action.kind, f_ms, v))
                elif action.kind.startswith("SEND"):
                    sends[_transfer_key(action)] = (start, end)
                    if not action.fused:
                        post.append((end - start) * 1e3)
                else:
                    recvs[_transfer_key(action)] = (start, end)
        for key, (send_start, send_end) in sends.items():
            if key in recvs and recvs[key][0] <= send_start:  # the receiver waited already
                hop.append((recvs[key][1] - send_end) * 1e3)
    return tuple(statistics.median(x) if x else 0.0 for x in (overrun, post, hop))


def replay(schedule, f_ms, overrun_ms=0.0, post_ms=0.0, hop_ms=0.0):
    """Mean idle fraction over ranks of `schedule` (a schedules.PipelineSchedule) executed
    with these costs (see the module)."""
    actions, p = schedule.actions, schedule.num_ranks
    v = schedule.num_stages // p
    clock, busy, at = [0.0] * p, [0.0] * p, [0] * p
    arrives = {}
    progressed = True
    while progressed:
        progressed = False
        for r in range(p):
            while at[r] < len(actions[r]):
                a = actions[r][at[r]]
                if a.kind in schedules.COMPUTE:
                    spent = nominal_ms(a.kind, f_ms, v) + overrun_ms
                    clock[r] += spent
                    busy[r] += spent
                elif a.kind.startswith("SEND"):
                    clock[r] += post_ms
                    arrives[_transfer_key(a)] = clock[r] + hop_ms
                elif _transfer_key(a) in arrives:
                    clock[r] = max(clock[r], arrives[_transfer_key(a)])
                else:
                    break  # its message is not sent yet: another rank first
                at[r] += 1
                progressed = True
    if any(at[r] < len(actions[r]) for r in range(p)):
        raise RuntimeError("replay of %s stalled: the action lists deadlock" % schedule.name)
    span = max(clock)
    return sum(1 - b / span for b in busy) / p
