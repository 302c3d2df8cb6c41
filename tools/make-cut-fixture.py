#!/usr/bin/env python3
"""Write fixtures/audio/fox-cut.wav: fixtures/audio/fox.wav's first 51 200 samples (3.20 s), its
bytes unchanged (16 kHz mono 16-bit PCM, as fox.wav). Standard library only, no tool versions:
the bytes follow from fox.wav's alone.

Its purpose (profiles/vad/silero-vad.yaml): a recording cut off mid-sentence ("The quick brown
fox ju|"), so the clip ends inside speech, and whose length is a whole number of 512-sample VAD
chunks (100). `get_speech_timestamps` then closes the last segment at the clip's end (the
segment still open when the probabilities run out), and a VAD stream fed the clip has nothing
left to zero-pad at `flush()` (models/vad: timestamps.py's open segment, model.py's empty flush).

    python3 tools/make-cut-fixture.py     # then: sha256sum fixtures/audio/fox-cut.wav
"""

from __future__ import annotations

import hashlib
import wave
from pathlib import Path

AUDIO = Path(__file__).resolve().parents[1] / "fixtures" / "audio"
NAME = "fox-cut.wav"
SAMPLES = 51_200  # 100 chunks of 512 samples: 3.20 s, in the middle of "jumps"


def main() -> None:
    with wave.open(str(AUDIO / "fox.wav"), "rb") as source:
        params = source.getparams()
        if (params.nchannels, params.sampwidth, params.framerate, params.comptype) != (1, 2, 16_000, "NONE"):
            raise SystemExit(f"fox.wav: expected 16 kHz mono 16-bit PCM, got {params}")
        if params.nframes < SAMPLES:
            raise SystemExit(f"fox.wav: {params.nframes} samples, fewer than the {SAMPLES} to keep")
        samples = source.readframes(SAMPLES)
    target = AUDIO / NAME
    with wave.open(str(target), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(16_000)
        out.writeframes(samples)
    print(
        f"{target.name}  {SAMPLES / 16_000:.2f} s  {SAMPLES} samples  {hashlib.sha256(target.read_bytes()).hexdigest()}"
    )


if __name__ == "__main__":
    main()
