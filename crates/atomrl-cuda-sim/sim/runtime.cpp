// The thread model of sim.h: a block's barrier and its warps' barriers and exchange slots,
// driven by the Rust launcher (src/launch.rs), which runs blocks one after another and a
// block's threads as host threads. Not reentrant: the launcher holds a lock around a launch.
#include "sim.h"

#include <barrier>
#include <memory>
#include <vector>

thread_local uint3 threadIdx;
uint3 blockIdx;
dim3 blockDim;
dim3 gridDim;

namespace {

struct Block {
    explicit Block(unsigned threads) : all(threads) {
        const unsigned warps = (threads + 31) / 32;
        for (unsigned w = 0; w < warps; ++w) {
            const unsigned lanes = threads - 32 * w < 32 ? threads - 32 * w : 32;
            warp.push_back(std::make_unique<std::barrier<>>(lanes));
        }
        slots.assign(32 * warps, 0);
    }
    std::barrier<> all;
    std::vector<std::unique_ptr<std::barrier<>>> warp;
    std::vector<uint64_t> slots;
};

Block *block = nullptr;
thread_local unsigned linear = 0;

}  // namespace

extern "C" void atomrl_sim_block_begin(const unsigned grid[3], const unsigned dims[3],
                                       const unsigned index[3]) {
    gridDim = dim3{grid[0], grid[1], grid[2]};
    blockDim = dim3{dims[0], dims[1], dims[2]};
    blockIdx = uint3{index[0], index[1], index[2]};
    block = new Block(dims[0] * dims[1] * dims[2]);
}

extern "C" void atomrl_sim_block_end(void) {
    delete block;
    block = nullptr;
}

extern "C" void atomrl_sim_thread_begin(unsigned t) {
    linear = t;
    threadIdx = uint3{t % blockDim.x, (t / blockDim.x) % blockDim.y,
                      t / (blockDim.x * blockDim.y)};
}

// A thread that returns no longer holds its block or warp at a barrier (as on the GPU, where
// exited threads do not count at `__syncthreads`).
extern "C" void atomrl_sim_thread_end(void) {
    block->all.arrive_and_drop();
    block->warp[linear / 32]->arrive_and_drop();
}

extern "C" void atomrl_sim_syncthreads(void) { block->all.arrive_and_wait(); }

extern "C" void atomrl_sim_syncwarp(void) { block->warp[linear / 32]->arrive_and_wait(); }

extern "C" uint64_t atomrl_sim_shfl_xor(uint64_t bits, int lane_mask) {
    const unsigned w = linear / 32, lane = linear % 32;
    uint64_t *slot = &block->slots[32 * w];
    slot[lane] = bits;
    block->warp[w]->arrive_and_wait();
    const unsigned from = lane ^ (unsigned)lane_mask;
    const unsigned threads = blockDim.x * blockDim.y * blockDim.z;
    const uint64_t out = 32 * w + from < threads ? slot[from] : bits;
    block->warp[w]->arrive_and_wait();
    return out;
}
