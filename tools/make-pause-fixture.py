#!/usr/bin/env python3
"""Write the fox-pause clips: digital silence (zero samples), then fixtures/audio/fox.wav's
samples unchanged (16 kHz mono 16-bit PCM, as fox.wav). One clip per model whose word alignment
it is tuned for (CLIPS, by name); the default writes fox-pause.wav, `--name` another, `--all`
every one.

Standard library only, no tool versions: the bytes follow from fox.wav's alone. Their purpose:
a long first word ending 3x to 4x the median word duration after the last speech (mlx-whisper's
pause rule, over 4x, keeps it; a 3x rule would cut it) and a word time whose milliseconds
round(t * 1000) and int(t * 1000) tell apart (harness/checks/exercise_whisper.py). Each model's
alignment puts the word times elsewhere, so each has its silence, found by trying lengths:

- fox-pause.wav, 1.74 s (27 840 samples; profiles/whisper-tiny-en.yaml, fox-pause-words):
  tiny.en's word alignment gives the first word, " The", the leading silence (0.00-2.32 s) and the
  window's median word duration is 0.61 s, so the word is too long (over twice the median) and
  ends 3.8 medians after the start. " fox" ends and " jumps" starts at 4.02 s, a time whose
  milliseconds round(4.02 * 1000) = 4020 and int(4.02 * 1000) = 4019 tell apart.
- fox-pause-base.wav, 2.02 s (32 320 samples; profiles/whisper-base.yaml, fox-pause-words):
  base's alignment gives " A" the silence (0.00-2.22 s) with a median word duration of 0.62 s
  (3x = 1.86 s, 4x = 2.48 s): it ends 3.58 medians after the start. " fox" / " jumps" meet at
  4.06 s (round 4060, int 4059). 1.74 s ended " A" at 1.94 s (3.0-3.2 medians: the 3x edge, and
  under the 3 x 0.7 s that harness/checks/exercise_whisper.py can prove from the words); 1.98 s at
  2.18 s with " fox" / " jumps" at 4.02 s (nearer that 2.1 s), 2.00 s at 4.04 s, 2.04 s at 4.08 s.

    python3 tools/make-pause-fixture.py --all     # then: sha256sum fixtures/audio/fox-pause*.wav
"""

from __future__ import annotations

import argparse
import hashlib
import wave
from pathlib import Path

AUDIO = Path(__file__).resolve().parents[1] / "fixtures" / "audio"
CLIPS = {  # name: samples of silence before fox.wav, at 16 kHz
    "fox-pause.wav": 27_840,  # 1.74 s: whisper-tiny-en
    "fox-pause-base.wav": 32_320,  # 2.02 s: whisper-base
}


def write(name: str) -> None:
    silence = CLIPS[name]
    with wave.open(str(AUDIO / "fox.wav"), "rb") as source:
        params = source.getparams()
        if (params.nchannels, params.sampwidth, params.framerate, params.comptype) != (1, 2, 16_000, "NONE"):
            raise SystemExit(f"fox.wav: expected 16 kHz mono 16-bit PCM, got {params}")
        samples = source.readframes(params.nframes)
    target = AUDIO / name
    with wave.open(str(target), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(16_000)
        out.writeframes(b"\x00\x00" * silence + samples)
    data = target.read_bytes()
    frames = silence + params.nframes
    print(f"{target.name}  {frames / 16_000:.2f} s  {frames} samples  {hashlib.sha256(data).hexdigest()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--name", choices=sorted(CLIPS), default="fox-pause.wav", help="the clip to write")
    which.add_argument("--all", action="store_true", help="write every clip")
    args = parser.parse_args()
    for name in sorted(CLIPS) if args.all else [args.name]:
        write(name)


if __name__ == "__main__":
    main()
