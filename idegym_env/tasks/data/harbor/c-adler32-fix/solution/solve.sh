#!/bin/bash
set -e
cd /app
sed -i 's/#define MOD_ADLER 65536/#define MOD_ADLER 65521/; s/            char c = (char)buf\[i\];/            unsigned char c = buf[i];/' adler32.c
make -s
