#!/usr/bin/env bash
# Keeps part $1 of Gemma 3 270M's weights in /tmp/g (calls 2-6 of a warm machine).
mkdir -p /tmp/g && cp .gpu/part /tmp/g/part$1 && ls -la /tmp/g
