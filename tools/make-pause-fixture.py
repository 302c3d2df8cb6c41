#!/usr/bin/env python3
"""Write fixtures/audio/fox-pause.wav: 1.74 s of digital silence (27 840 zero samples), then
fixtures/audio/fox.wav's samples unchanged (16 kHz mono 16-bit PCM, as fox.wav).

Standard library only, no tool versions: the bytes follow from fox.wav's alone. Its purpose
(profiles/whisper-tiny-en.yaml, fox-pause-words): tiny.en's word alignment gives the first word,
" The", the leading silence (0.00-2.32 s) and the window's median word duration is 0.61 s, so the
word is too long (over twice the median) and ends 3.8 medians after the start: mlx-whisper's pause
rule (over 4x) keeps it, a 3x rule would cut it. " fox" ends and " jumps" starts at 4.02 s, a
time whose milliseconds round(4.02 * 1000) = 4020 and int(4.02 * 1000) = 4019 tell apart.

    python3 tools/make-pause-fixture.py     # then: sha256sum fixtures/audio/fox-pause.wav
"""

from __future__ import annotations

import hashlib
import wave
from pathlib import Path

AUDIO = Path(__file__).resolve().parents[1] / "fixtures" / "audio"
SILENCE_SAMPLES = 27_840  # 1.74 s at 16 kHz


def main() -> None:
    with wave.open(str(AUDIO / "fox.wav"), "rb") as source:
        params = source.getparams()
        if (params.nchannels, params.sampwidth, params.framerate, params.comptype) != (1, 2, 16_000, "NONE"):
            raise SystemExit(f"fox.wav: expected 16 kHz mono 16-bit PCM, got {params}")
        samples = source.readframes(params.nframes)
    target = AUDIO / "fox-pause.wav"
    with wave.open(str(target), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(16_000)
        out.writeframes(b"\x00\x00" * SILENCE_SAMPLES + samples)
    data = target.read_bytes()
    frames = SILENCE_SAMPLES + params.nframes
    print(f"{target.name}  {frames / 16_000:.2f} s  {frames} samples  {hashlib.sha256(data).hexdigest()}")


if __name__ == "__main__":
    main()
