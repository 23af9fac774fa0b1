#!/bin/bash
# Verifier of fix-sum, in Harbor's convention: runs from the working directory (/app) after the agent;
# the reward (1 when every check of check-sum passes, else 0) goes to /logs/verifier/reward.txt.
# check-sum comes from the image's RUN step.
mkdir -p /logs/verifier
if check-sum /app/sum.sh; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
