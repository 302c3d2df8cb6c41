"""Build the clips for mlx-whisper's `hallucination_silence_threshold` pass (whisper-tiny-en,
word timestamps), from the fixtures beside this script. numpy + wave only; deterministic
(digital silence, time reversal, and numpy's legacy RandomState for the one noise burst).

    python3 tools/make-hallucination-fixtures.py     # then: sha256sum fixtures/audio/hallucination-*.wav

hallucination-tail.wav (60.00 s; threshold 1.0): two windows. 0-30 s is clean speech (fox,
weather, message), so the second window starts at exactly 30 s; there, weather again (tiny.en
skips it: already in the prompt), fox, silence, then weather reversed ending at 59.3 s, which
tiny.en turns into an anomalous segment (low-probability words) ending 0.82 s before the clip
end and under 2 s before the window end: the tail is cut and seek jumps to the clip end.

hallucination-drop.wav (53.87 s; threshold 2.0): reversed fox after 2.67 s of silence, a
noise burst, message twice, reversed weather, weather, reversed message (found by a seeded
search, seed 2004). The first window's first worded segment is anomalous and starts 24.96 s in,
so the window is dropped; the next holds an anomalous first segment with speech right after it
(kept); the last ones hold anomalous segments in silence that are cut off (seek moves by 1 s).
"""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent.parent / "fixtures" / "audio"
SR = 16000


def load(name: str) -> np.ndarray:
    with wave.open(str(HERE / f"{name}.wav"), "rb") as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (SR, 1, 2)
        return np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.float64)


def sil(seconds: float) -> np.ndarray:
    return np.zeros(int(round(seconds * SR)))


def noise(seconds: float, amplitude: float, seed: int) -> np.ndarray:
    rng = np.random.RandomState(seed)
    return rng.uniform(-1, 1, int(round(seconds * SR))) * amplitude * 32767


def save(name: str, x: np.ndarray) -> None:
    samples = np.clip(np.round(x), -32768, 32767).astype("<i2")
    with wave.open(str(HERE / name), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(SR)
        w.writeframes(samples.tobytes())


def tail_clip(fox: np.ndarray, weather: np.ndarray, message: np.ndarray) -> np.ndarray:
    first = np.concatenate([sil(1.74), fox, sil(2.5), weather, sil(2.5), message])
    first = np.concatenate([first, sil(31.0 - len(first) / SR)])
    speech = np.concatenate([first, weather, sil(2.0), fox])
    reversed_weather = weather[::-1]
    x = np.concatenate([speech, sil(59.3 - len(reversed_weather) / SR - len(speech) / SR), reversed_weather])
    return np.concatenate([x, sil(60.0 - len(x) / SR)])


def drop_clip(fox: np.ndarray, weather: np.ndarray, message: np.ndarray) -> np.ndarray:
    return np.concatenate(
        [
            sil(2.67),
            fox[::-1],
            sil(3.78),
            noise(2.65, 0.03, seed=2004),
            sil(3.64),
            message,
            sil(0.34),
            message,
            sil(2.72),
            weather[::-1],
            sil(0.84),
            weather,
            sil(2.58),
            message[::-1],
            sil(0.32),
        ]
    )


def main() -> None:
    fox, weather, message = load("fox"), load("weather"), load("message")
    save("hallucination-tail.wav", tail_clip(fox, weather, message))
    save("hallucination-drop.wav", drop_clip(fox, weather, message))


if __name__ == "__main__":
    main()
