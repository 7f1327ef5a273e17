#!/usr/bin/env python3
"""An example `omen bench` hook: JSON lines on stdin, answers on stdout (docs/bench.md, "Hooks").

- before_request: tags the request with OpenAI's `user` field (one per session), so the
  server's logs can tell the bench's sessions apart; answers {"ask": N, "body": ...}.
- chunk: collects each answer's text (no answer is owed); a retry starts the text again.
- finalise: answers {"ask": N, "metrics": ...} with the words per answer and the share of
  answers that end a sentence, metrics omen does not compute itself.

Every answer echoes the question's `ask` number. Logs go to stderr, never stdout.
Run it with: omen bench ... --hook "python3 deploy/bench/hooks/answer_words.py"
"""
import json
import sys


def main() -> None:
    # (run, request id) -> (attempt, text so far)
    answers: dict[tuple[int, int], tuple[int, str]] = {}
    for line in sys.stdin:
        message = json.loads(line)
        stage = message.get("stage")
        if stage == "before_request":
            body = message["body"]
            body["user"] = f"omen-bench-session-{message['session']}"
            print(json.dumps({"ask": message["ask"], "body": body}), flush=True)
        elif stage == "chunk":
            key = (message["run"], message["id"])
            attempt, text = answers.get(key, (message["attempt"], ""))
            if attempt != message["attempt"]:
                text = ""
            answers[key] = (message["attempt"], text + message["text"])
        elif stage == "finalise":
            texts = [text for _, text in answers.values()]
            words = [len(t.split()) for t in texts]
            ended = [t.rstrip().endswith((".", "!", "?")) for t in texts]
            metrics = {
                "answers": len(words),
                "mean_words_per_answer": sum(words) / len(words) if words else 0.0,
                "share_ending_a_sentence": sum(ended) / len(ended) if ended else 0.0,
            }
            print(json.dumps({"ask": message["ask"], "metrics": metrics}), flush=True)


if __name__ == "__main__":
    main()
