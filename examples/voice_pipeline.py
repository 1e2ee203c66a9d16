"""A voice pipeline's use of genie: stream the answer sentence by sentence into TTS, and cut it off when
the user speaks again (barge-in).

    genie-daemon &                       # in another terminal, or as the systemd service
    python examples/voice_pipeline.py [--socket-dir DIR] [--barge-in-after 2]

Sentences are printed as they complete (`sentence_end` on a DELTA); after `--barge-in-after` sentences the
script simulates the user talking over the assistant and cancels the rest.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from genie_common.config import DaemonConfig
from genie_protocol.client import GenieClient
from genie_protocol.messages import Delta, Done, Error


async def speak(endpoint: str, question: str, barge_in_after: int) -> None:
    async with GenieClient(endpoint) as client:
        t0 = time.monotonic()
        sentence, spoken = [], 0
        async for ev in client.generate(
            request_id="turn-1",
            messages=[{"role": "user", "content": question}],
            params={"max_tokens": 200},
            priority="voice",
        ):
            if isinstance(ev, Delta):
                sentence.append(ev.text)
                if ev.sentence_end:
                    spoken += 1
                    print(f"[TTS {time.monotonic() - t0:5.2f} s] {''.join(sentence).strip()}", flush=True)
                    sentence = []
                    if spoken == barge_in_after:
                        print("[user starts talking: barge-in]", flush=True)
                        await client.cancel("turn-1")
            elif isinstance(ev, Done):
                print(f"[done: {ev.finish_reason}, {ev.usage}]")
            elif isinstance(ev, Error):
                print(f"[error {ev.code}: {ev.message}]")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--socket-dir", default=DaemonConfig().socket_dir)
    p.add_argument("--question", default="Tell me about the history of bread, in a few sentences.")
    p.add_argument("--barge-in-after", type=int, default=2)
    args = p.parse_args()
    asyncio.run(speak(DaemonConfig(socket_dir=args.socket_dir).client_endpoint, args.question, args.barge_in_after))


if __name__ == "__main__":
    main()
