#!/usr/bin/env bash
# Regenerate the speech/silence/noise clips in fixtures/audio (16 kHz mono 16-bit WAV).
# Needs espeak-ng and sox:  apt-get update && apt-get install -y espeak-ng sox
# The bytes depend on the espeak-ng and sox versions (recorded in fixtures/audio/README.md with
# each clip's sha256); `sox -R` keeps sox's dither repeatable from run to run.
set -euo pipefail
tools=$(cd "$(dirname "$0")" && pwd)
cd "$tools/../fixtures/audio"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# speak NAME VOICE SPEED GAP TEXT: espeak-ng at 22.05 kHz, then resampled to 16 kHz mono 16-bit.
speak() {
    espeak-ng -v "$2" -s "$3" -g "$4" -w "$tmp/$1.wav" "$5"
    sox -R "$tmp/$1.wav" -r 16000 -c 1 -b 16 "$1.wav"
}

speak fox en-us 120 8 "The quick brown fox jumps over the lazy dog."
speak weather en-gb 130 8 "It is going to rain tomorrow. So please take an umbrella with you."
speak message en-us+f3 130 8 "Please call me back when you get this message."
# Over 30 s: the first window ends mid-clip and the second one starts inside it.
speak long en-us 120 8 "Good morning everyone. Time flies when you are having fun. \
My sister lives in a small house near the river. \
Every morning I drink a cup of coffee and read the news before I go to work. \
Please remember to turn off the lights when you leave the room. We will meet again next week."
# German at espeak-ng's default speed, for language detection by the multilingual models
# (whisper-base detects Latin in slow French speech, German here with p = 0.84).
speak german de 175 0 "Guten Morgen. Das Wetter ist heute sehr schön, also gehen wir in den Park."
# 2 s of digital silence, and 2 s of low-level white noise (seeded by -R).
sox -R -n -r 16000 -c 1 -b 16 silence.wav trim 0 2
sox -R -n -r 16000 -c 1 -b 16 noise.wav synth 2 whitenoise vol 0.02
# fox.wav after digital silence (Whisper word timing's pause rule, a cue time that truncated
# milliseconds change): 1.74 s for tiny.en (fox-pause.wav), 2.02 s for base (fox-pause-base.wav),
# derived from fox.wav by the standard library alone (tools/make-pause-fixture.py says why).
python3 "$tools/make-pause-fixture.py" --all >/dev/null
# weather.wav delayed by a fraction of a sample past 45: a fast-path near-tie on tiny.en, and the
# calibration clip whose float16 compute flips it (tools/make-near-tie-fixture.py says why).
python3 "$tools/make-near-tie-fixture.py" >/dev/null

for f in fox weather message long german silence noise fox-pause fox-pause-base weather-near-tie weather-near-tie-calib; do
    printf '%-12s %6.2f s  %s\n' "$f.wav" "$(soxi -D "$f.wav")" "$(sha256sum "$f.wav" | cut -d' ' -f1)"
done
