#!/usr/bin/env python3
"""An example `omen bench` hook: JSON lines on stdin, answers on stdout (docs/bench.md, "Hooks").

- before_request: tags the request with OpenAI's `user` field (one per session), so the
  server's logs can tell the bench's sessions apart; answers {"body": ...}.
- chunk: collects each answer's text (no answer is owed).
- finalise: answers {"metrics": ...} with the words per answer and the share of answers
  that end a sentence, metrics omen does not compute itself.

Run it with: omen bench ... --hook "python3 deploy/bench/hooks/answer_words.py"
"""
import json
import sys


def main() -> None:
    answers: dict[int, str] = {}
    for line in sys.stdin:
        message = json.loads(line)
        stage = message.get("stage")
        if stage == "before_request":
            body = message["body"]
            body["user"] = f"omen-bench-session-{message['session']}"
            print(json.dumps({"body": body}), flush=True)
        elif stage == "chunk":
            answers[message["id"]] = answers.get(message["id"], "") + message["text"]
        elif stage == "finalise":
            words = [len(a.split()) for a in answers.values()]
            ended = [a.rstrip().endswith((".", "!", "?")) for a in answers.values()]
            metrics = {
                "answers": len(words),
                "mean_words_per_answer": sum(words) / len(words) if words else 0.0,
                "share_ending_a_sentence": sum(ended) / len(ended) if ended else 0.0,
            }
            print(json.dumps({"metrics": metrics}), flush=True)


if __name__ == "__main__":
    main()
