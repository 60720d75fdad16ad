// BLAKE2s-256 (RFC 7693, no key, 32-byte digest: Python's hashlib.blake2s()) of every CHUNK-byte chunk of a buffer,
// one thread per chunk, for output_digest's tree hash of a GPU output. Compiled at run time by NVRTC, so it uses no
// header; a harness on the host includes it with KA_FN defined as a host function and runs every thread of a launch
// in turn (tests/evaluator/test_chunk_hash.py).
#ifndef KA_FN
#define KA_FN __device__ __forceinline__
#endif

typedef unsigned int ka_u32;
typedef unsigned char ka_u8;
typedef unsigned long long ka_u64;

#define KA_CHUNK 4096

KA_FN ka_u32 ka_rotr(ka_u32 x, int n) { return (x >> n) | (x << (32 - n)); }

#define KA_G(a, b, c, d, x, y)          \
    v[a] = v[a] + v[b] + (x);           \
    v[d] = ka_rotr(v[d] ^ v[a], 16);    \
    v[c] = v[c] + v[d];                 \
    v[b] = ka_rotr(v[b] ^ v[c], 12);    \
    v[a] = v[a] + v[b] + (y);           \
    v[d] = ka_rotr(v[d] ^ v[a], 8);     \
    v[c] = v[c] + v[d];                 \
    v[b] = ka_rotr(v[b] ^ v[c], 7);

KA_FN void ka_compress(ka_u32 h[8], const ka_u32 m[16], ka_u32 counter, bool last) {
    const ka_u32 iv[8] = {0x6A09E667u, 0xBB67AE85u, 0x3C6EF372u, 0xA54FF53Au,
                          0x510E527Fu, 0x9B05688Cu, 0x1F83D9ABu, 0x5BE0CD19u};
    const ka_u8 sigma[10][16] = {
        {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
        {11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4}, {7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8},
        {9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13}, {2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9},
        {12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11}, {13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10},
        {6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5}, {10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0},
    };
    ka_u32 v[16];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        v[i] = h[i];
        v[i + 8] = iv[i];
    }
    v[12] ^= counter;  // the high word of the byte counter stays 0: a chunk is far below 4 GiB
    if (last) v[14] = ~v[14];
#pragma unroll
    for (int r = 0; r < 10; ++r) {
        const ka_u8* s = sigma[r];
        KA_G(0, 4, 8, 12, m[s[0]], m[s[1]]);
        KA_G(1, 5, 9, 13, m[s[2]], m[s[3]]);
        KA_G(2, 6, 10, 14, m[s[4]], m[s[5]]);
        KA_G(3, 7, 11, 15, m[s[6]], m[s[7]]);
        KA_G(0, 5, 10, 15, m[s[8]], m[s[9]]);
        KA_G(1, 6, 11, 12, m[s[10]], m[s[11]]);
        KA_G(2, 7, 8, 13, m[s[12]], m[s[13]]);
        KA_G(3, 4, 9, 14, m[s[14]], m[s[15]]);
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) h[i] ^= v[i] ^ v[i + 8];
}

// The digest of `length` bytes at `data` (4-byte aligned) into `out` (32 bytes, 4-byte aligned).
KA_FN void ka_blake2s(const ka_u8* data, ka_u32 length, ka_u8* out) {
    ka_u32 h[8] = {0x6A09E667u ^ 0x01010020u, 0xBB67AE85u, 0x3C6EF372u, 0xA54FF53Au,
                   0x510E527Fu, 0x9B05688Cu, 0x1F83D9ABu, 0x5BE0CD19u};
    ka_u32 blocks = length == 0 ? 1 : (length + 63) / 64;
    for (ka_u32 b = 0; b < blocks; ++b) {
        ka_u32 m[16];
        ka_u32 start = b * 64;
        if (start + 64 <= length) {
            const ka_u32* words = (const ka_u32*)(data + start);
#pragma unroll
            for (int i = 0; i < 16; ++i) m[i] = words[i];  // little-endian, as BLAKE2s reads them
        } else {
#pragma unroll
            for (int i = 0; i < 16; ++i) {
                ka_u32 word = 0;
                for (int k = 0; k < 4; ++k) {
                    ka_u32 at = start + 4 * i + k;
                    if (at < length) word |= (ka_u32)data[at] << (8 * k);
                }
                m[i] = word;
            }
        }
        bool last = b + 1 == blocks;
        ka_compress(h, m, last ? length : start + 64, last);
    }
    ka_u32* words = (ka_u32*)out;
#pragma unroll
    for (int i = 0; i < 8; ++i) words[i] = h[i];
}

// One thread's work in a level of the tree for every call of a block at once: call `call`'s buffer starts at
// sources[call] (16-byte aligned) and holds `chunks` chunks, the last `last_length` bytes long; the digest of chunk
// `chunk` goes to out[(call * chunks + chunk) * 32].
KA_FN void ka_chunk_hash(const ka_u64* sources, ka_u8* out, int chunks, int last_length, ka_u32 call, int chunk) {
    if (chunk >= chunks) return;
    const ka_u8* data = (const ka_u8*)sources[call] + (ka_u64)chunk * KA_CHUNK;
    ka_u32 length = chunk == chunks - 1 ? (ka_u32)last_length : KA_CHUNK;
    ka_blake2s(data, length, out + ((ka_u64)call * chunks + chunk) * 32);
}

#ifndef KA_HOST_ONLY
extern "C" __global__ void ka_chunk_hashes(const ka_u64* sources, ka_u8* out, int chunks, int last_length) {
    ka_chunk_hash(sources, out, chunks, last_length, blockIdx.y, blockIdx.x * blockDim.x + threadIdx.x);
}
#endif
