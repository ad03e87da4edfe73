"""Turns on the event loop: within a slice work goes on, past it whatever else
is ready runs first, turns go round between owners, and a pass gives as
many turns as the last pass left time for."""

from __future__ import annotations

import asyncio

from resolvers.core.turns import Turns


class Clock:
    def __init__(self, step: float = 0.0) -> None:
        self.now = 100.0
        self.step = step  # how far each reading moves it: time passes as work runs

    def __call__(self) -> float:
        self.now += self.step
        return self.now


async def test_within_the_slice_work_goes_on_without_waiting() -> None:
    clock = Clock()
    turns = Turns(slice_seconds=1.0, idle_seconds=5.0, clock=clock)
    await turns.take("a")  # idle: a slice starts
    ran: list[str] = []
    asyncio.get_running_loop().call_soon(ran.append, "other")
    clock.now += 0.5
    await turns.take("a")
    assert ran == []  # nothing else ran: the take did not wait


async def test_past_the_slice_what_was_ready_runs_first() -> None:
    clock = Clock()
    turns = Turns(slice_seconds=1.0, idle_seconds=5.0, clock=clock)
    await turns.take("a")
    clock.now += 2.0  # the slice is spent, but not long enough ago to count as idle
    ran: list[str] = []
    asyncio.get_running_loop().call_soon(ran.append, "other")
    await turns.take("a")
    assert ran == ["other"]


async def test_an_idle_process_goes_on_at_once() -> None:
    clock = Clock()
    turns = Turns(slice_seconds=1.0, idle_seconds=5.0, clock=clock)
    await turns.take("a")
    clock.now += 10.0
    ran: list[str] = []
    asyncio.get_running_loop().call_soon(ran.append, "other")
    await turns.take("a")
    assert ran == []


async def test_turns_go_round_between_owners() -> None:
    clock = Clock(step=0.001)
    turns = Turns(slice_seconds=0.0, idle_seconds=1e9, clock=clock)
    order: list[str] = []

    async def piece(owner: str, n: int) -> None:
        await turns.take(owner)
        order.append(f"{owner}{n}")

    # A large operation queues three pieces before a small one asks for its one.
    busy = [asyncio.create_task(piece("big", n)) for n in range(3)]
    await asyncio.sleep(0)
    small = asyncio.create_task(piece("small", 0))
    await asyncio.gather(*busy, small)
    assert order == ["big0", "small0", "big1", "big2"]
    assert turns.waiting == 0


async def test_a_cancelled_wait_gives_its_turn_to_the_next() -> None:
    clock = Clock(step=0.001)
    turns = Turns(slice_seconds=0.0, idle_seconds=1e9, clock=clock)
    order: list[str] = []

    async def piece(owner: str) -> None:
        await turns.take(owner)
        order.append(owner)

    stopped = asyncio.create_task(piece("stopped"))
    going = asyncio.create_task(piece("going"))
    await asyncio.sleep(0)  # both wait now
    assert turns.waiting == 2
    stopped.cancel()
    await asyncio.gather(going, stopped, return_exceptions=True)
    assert order == ["going"]
    assert turns.waiting == 0


async def passes_of(turns: Turns, pieces: int) -> list[int]:
    """How many pieces of one operation ran in each pass of the loop, when all
    of them asked for a turn past the slice."""
    loop = asyncio.get_running_loop()
    passes = 0
    ran: list[int] = []

    def tick() -> None:
        nonlocal passes
        passes += 1
        if len(ran) < pieces:
            loop.call_soon(tick)

    async def piece() -> None:
        await turns.take("big")
        ran.append(passes)

    loop.call_soon(tick)
    await asyncio.gather(*(piece() for _ in range(pieces)))
    return [ran.count(n) for n in sorted(set(ran))]


async def test_a_pass_well_inside_the_slice_gives_twice_the_turns_next() -> None:
    clock = Clock()  # the pieces take no time at all
    turns = Turns(slice_seconds=1.0, idle_seconds=1e9, clock=clock)
    assert await passes_of(turns, 7) == [1, 2, 4]
    assert turns.waiting == 0


async def test_passes_past_the_slice_give_one_turn_each() -> None:
    clock = Clock(step=2.0)  # every reading is a slice and more later
    turns = Turns(slice_seconds=1.0, idle_seconds=1e9, clock=clock)
    assert await passes_of(turns, 4) == [1, 1, 1, 1]
