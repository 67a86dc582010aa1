#!/bin/bash
mkdir -p /logs/verifier
rm -f /logs/verifier/reward.json
node /tests/test.js
