#!/bin/bash
# Verifier of fix-add, in Harbor's convention: runs from the working directory (/app), the hidden
# tests are in /tests, the reward (1 when they all pass, else 0) goes to /logs/verifier/reward.txt.
# -I: nothing of the working directory (the agent's files) is imported by the test runner itself.
mkdir -p /logs/verifier
if python3 -I -m unittest discover -s /tests -p 'test_*.py' -v; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
