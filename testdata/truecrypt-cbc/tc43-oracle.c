/* ucrypt's test-vector driver: encrypts two sectors of a known plaintext with TrueCrypt 4.3a's
 * own EncryptSectors for every legacy CBC chain, printing one JSON line per case (see
 * README.md; built against a TrueCrypt 4.3a source tree by make-vectors.sh). The EA numbers
 * are the rows of 4.3a's EncryptionAlgorithms table. */
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include "Tcdefs.h"
#include "Crypto.h"
static void hex(const unsigned char *b, int n) { for (int i = 0; i < n; i++) printf("%02x", b[i]); }
int main(void) {
	static const struct { int ea; int mode; const char *name; } cases[] = {
		{ 2, CBC, "blowfish" }, { 1, CBC, "aes" }, { 3, CBC, "cast5" }, { 5, CBC, "des3_ede" },
		{ 7, OUTER_CBC, "twofish-aes" }, { 8, OUTER_CBC, "serpent-twofish-aes" },
		{ 9, OUTER_CBC, "aes-serpent" }, { 10, OUTER_CBC, "aes-twofish-serpent" },
		{ 11, OUTER_CBC, "serpent-twofish" },
		{ 12, INNER_CBC, "blowfish_le-aes" }, { 13, INNER_CBC, "serpent-blowfish_le-aes" },
	};
	static const unsigned long long sectors[] = { 1, 37, 0x123456789aULL };
	for (unsigned c = 0; c < sizeof cases / sizeof cases[0]; c++) {
		unsigned char key[256];
		for (int i = 0; i < 256; i++) key[i] = (unsigned char)(i * 7 + 3 + c);
		PCRYPTO_INFO ci = crypto_open();
		ci->ea = cases[c].ea; ci->mode = cases[c].mode;
		if (EAInit(ci->ea, key + DISK_IV_SIZE, ci->ks) == ERR_CIPHER_INIT_FAILURE) { fprintf(stderr, "init\n"); return 1; }
		memcpy(ci->iv, key, DISK_IV_SIZE);
		int klen = DISK_IV_SIZE + EAGetKeySize(ci->ea);
		for (unsigned s = 0; s < sizeof sectors / sizeof sectors[0]; s++) {
			unsigned char buf[1024];
			for (int i = 0; i < 1024; i++) buf[i] = (unsigned char)(i * 13 + s);
			EncryptSectors((unsigned __int32 *)buf, sectors[s], 2, ci);
			printf("{\"chain\":\"%s\",\"mode\":\"%s\",\"key_area_hex\":\"", cases[c].name,
			       cases[c].mode == CBC ? "cbc" : cases[c].mode == OUTER_CBC ? "outer-cbc" : "inner-cbc");
			hex(key, klen);
			printf("\",\"first_sector\":%llu,\"sectors\":2,\"plaintext\":\"i*13+%u\",\"ciphertext_hex\":\"", sectors[s], s);
			hex(buf, 1024);
			printf("\"}\n");
		}
		crypto_close(ci);
	}
	return 0;
}
