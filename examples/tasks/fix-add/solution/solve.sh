#!/bin/bash
# Reference solution (Harbor's oracle); ignored for training.
sed -i 's/return a - b/return a + b/' /app/calc.py
