/* adler32: print the Adler-32 checksum of standard input (RFC 1950, section 8.2). */
#include <stdio.h>
#include <stdint.h>

#define MOD_ADLER 65536

int main(void) {
    uint32_t a = 1, b = 0;
    unsigned char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, stdin)) > 0) {
        for (size_t i = 0; i < n; i++) {
            char c = (char)buf[i];
            a = (a + c) % MOD_ADLER;
            b = (b + a) % MOD_ADLER;
        }
    }
    printf("%08x\n", (unsigned)((b << 16) | a));
    return 0;
}
