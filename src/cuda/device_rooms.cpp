// DeviceRooms (device_rooms.hpp): the device records of reserved rooms.
#include "cuda/device_rooms.hpp"

#include <cstddef>
#include <cstring>
#include <new>
#include <vector>

namespace ikv {

static_assert(offsetof(cuda::RoomRecord, stale_read) == offsetof(cuda::RoomRecord, overrun) + 4,
              "take() clears overrun and stale_read with one copy");

ikv_status DeviceRooms::set(const PageStore::Room &room, void **record, const char *fn) {
    cudaError_t err = cudaDeviceSynchronize();
    if (err != cudaSuccess) return cuda_fail(err, fn, "waiting for the device before writing a room's record");
    Handle *h = static_cast<Handle *>(*record);
    Handle fresh;
    std::vector<uint8_t> image, page_image;
    try {
        image.resize(record_bytes());
        page_image.resize(12ull * room.n_pages);
        if (h == nullptr) h = &fresh;
    } catch (const std::bad_alloc &) {
        return fail(IKV_E_NOMEM, "%s: out of host memory", fn);
    }
    cuda::RoomRecord *dev = h->dev;
    if (dev == nullptr) {
        err = cudaMalloc(reinterpret_cast<void **>(&dev), record_bytes());
        if (err != cudaSuccess) return cuda_fail(err, fn, "cudaMalloc of a room's record");
    }
    uint8_t *pages = nullptr;
    err = cudaMalloc(reinterpret_cast<void **>(&pages), page_image.size());
    auto undo = [&] {
        if (pages) cudaFree(pages);
        if (dev != h->dev) cudaFree(dev);
    };
    if (err != cudaSuccess) {
        undo();
        return cuda_fail(err, fn, "cudaMalloc of a room's page list");
    }
    // Host images of both allocations, then one copy each.
    cuda::RoomRecord hdr{};
    hdr.page_first = room.page_first;
    hdr.n_pages = room.n_pages;
    hdr.end = room.end;
    hdr.seq = uint32_t(room.seq);
    uint8_t *base = reinterpret_cast<uint8_t *>(dev);
    hdr.lengths = reinterpret_cast<uint32_t *>(base + lengths_offset());
    hdr.tickets = reinterpret_cast<uint32_t *>(base + tickets_offset());  // zero in the image
    hdr.stages = reinterpret_cast<float *const *>(base + stages_offset());
    hdr.pages = reinterpret_cast<uint8_t *const *>(pages);
    hdr.formats = reinterpret_cast<const uint32_t *>(pages + 8ull * room.n_pages);
    std::memcpy(image.data(), &hdr, sizeof hdr);
    std::memcpy(image.data() + lengths_offset(), room.lengths, 4ull * n_layers_);
    std::memcpy(image.data() + stages_offset(), room.stages, 8ull * n_layers_);
    std::memcpy(page_image.data(), room.pages, 8ull * room.n_pages);
    for (uint32_t i = 0; i < room.n_pages; ++i) {
        const uint32_t f = uint32_t(room.formats[i]);
        std::memcpy(page_image.data() + 8ull * room.n_pages + 4ull * i, &f, 4);
    }
    err = cudaMemcpy(pages, page_image.data(), page_image.size(), cudaMemcpyHostToDevice);
    if (err == cudaSuccess) err = cudaMemcpy(dev, image.data(), image.size(), cudaMemcpyHostToDevice);
    if (err != cudaSuccess) {
        undo();  // a partly written existing record: its old page list is still there and no kernel runs
        return cuda_fail(err, fn, "cudaMemcpy of a room's record");
    }
    if (h == &fresh) {
        Handle *made = nullptr;
        try {
            made = new Handle{dev, pages};
            rooms_.insert(made);
        } catch (const std::bad_alloc &) {
            delete made;
            undo();
            return fail(IKV_E_NOMEM, "%s: out of host memory", fn);
        }
        *record = made;
        return IKV_OK;
    }
    if (h->pages) cudaFree(h->pages);
    h->pages = pages;
    return IKV_OK;
}

ikv_status DeviceRooms::take(void *record, uint32_t *lengths, PageStore::RoomReport *report, const char *fn) {
    Handle *h = static_cast<Handle *>(record);
    cuda::RoomRecord hdr{};
    cudaError_t err = cudaDeviceSynchronize();
    if (err == cudaSuccess) err = cudaMemcpy(&hdr, h->dev, sizeof hdr, cudaMemcpyDeviceToHost);
    if (err == cudaSuccess)
        err = cudaMemcpy(lengths, reinterpret_cast<uint8_t *>(h->dev) + lengths_offset(), 4ull * n_layers_,
                         cudaMemcpyDeviceToHost);
    if (err == cudaSuccess && (hdr.overrun != 0 || hdr.stale_read != 0)) {
        const uint32_t zeros[2] = {0, 0};  // overrun and stale_read are adjacent
        err = cudaMemcpy(&h->dev->overrun, zeros, sizeof zeros, cudaMemcpyHostToDevice);
    }
    if (err != cudaSuccess) return cuda_fail(err, fn, "reading a room's lengths from the device");
    report->overrun_layer = hdr.overrun != 0 ? int64_t(hdr.overrun) - 1 : -1;
    report->stale_read = hdr.stale_read != 0;
    return IKV_OK;
}

void DeviceRooms::free(void *record) {
    Handle *h = static_cast<Handle *>(record);
    cudaDeviceSynchronize();  // no kernel may still read it
    rooms_.erase(h);
    release(h);
}

}  // namespace ikv
