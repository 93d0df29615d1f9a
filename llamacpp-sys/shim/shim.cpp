// Exception barrier for the llama.cpp entry points that can throw a C++
// exception through the C ABI. A C++ exception that reaches Rust aborts the
// process; here it is caught and turned into a return code, and its message
// is kept per thread for llama_rs_last_exception().
//
// Convention: every function returns LLAMA_RS_OK (0) when the wrapped call
// returned normally (its own result goes to an out-parameter) and
// LLAMA_RS_EXCEPTION (-1) when it threw.

#include "llama.h"

#ifdef LLAMA_RS_MTMD
#include "mtmd.h"
#include "mtmd-helper.h"
#endif

#include <map>

#ifdef LLAMA_RS_INSTALLED_HEADERS
// An installed llama.cpp has no src/llama-ext.h (its staging C++ API), so
// the one function of it the shim calls is declared here as that header
// declares it at the pinned commit. The build has compared the installed
// headers with the ones the bindings came from (build/abi.rs), so the
// library is that commit.
struct llama_memory_breakdown_data {
    size_t model   = 0;
    size_t context = 0;
    size_t compute = 0;
};
using llama_memory_breakdown = std::map<ggml_backend_buffer_type_t, llama_memory_breakdown_data>;
LLAMA_API llama_memory_breakdown llama_get_memory_breakdown(const struct llama_context * ctx);
#else
// src/llama-ext.h: llama.cpp's staging API (C++), for the memory breakdown.
#include "llama-ext.h"
#endif

#include <atomic>
#include <cstdio>
#include <cstring>
#include <exception>
#include <mutex>
#include <new>
#include <regex>
#include <stdexcept>
#include <string>

#if defined(__unix__) || defined(__APPLE__)
#include <pthread.h>
#define LLAMA_RS_RPC_GUARD 1
#endif

namespace {

thread_local std::string last_message;
thread_local bool inject_next = false;

constexpr int LLAMA_RS_OK = 0;
constexpr int LLAMA_RS_EXCEPTION = -1;

template <typename F>
int guarded(F && f) noexcept {
    try {
        if (inject_next) {
            inject_next = false;
            throw std::runtime_error("exception injected by llama_rs_shim_inject_exception");
        }
        f();
        return LLAMA_RS_OK;
    } catch (const std::exception & e) {
        try { last_message = e.what(); } catch (...) {}
        return LLAMA_RS_EXCEPTION;
    } catch (...) {
        try { last_message = "unknown C++ exception"; } catch (...) {}
        return LLAMA_RS_EXCEPTION;
    }
}

} // namespace

extern "C" {

// The message of the last exception caught on this thread ("" if none).
const char * llama_rs_last_exception(void) {
    return last_message.c_str();
}

// Makes the next guarded call on this thread throw inside its try block,
// so tests can prove the barrier of calls whose real throw paths need a
// failing allocator or a broken device.
void llama_rs_shim_inject_exception(void) {
    inject_next = true;
}

int llama_rs_decode(llama_context * ctx, llama_batch batch, int32_t * result) {
    return guarded([&] { *result = llama_decode(ctx, batch); });
}

int llama_rs_encode(llama_context * ctx, llama_batch batch, int32_t * result) {
    return guarded([&] { *result = llama_encode(ctx, batch); });
}

int llama_rs_tokenize(const llama_vocab * vocab, const char * text, int32_t text_len, llama_token * tokens,
                      int32_t n_tokens_max, bool add_special, bool parse_special, int32_t * result) {
    return guarded([&] { *result = llama_tokenize(vocab, text, text_len, tokens, n_tokens_max, add_special, parse_special); });
}

int llama_rs_token_to_piece(const llama_vocab * vocab, llama_token token, char * buf, int32_t length, int32_t lstrip,
                            bool special, int32_t * result) {
    return guarded([&] { *result = llama_token_to_piece(vocab, token, buf, length, lstrip, special); });
}

int llama_rs_detokenize(const llama_vocab * vocab, const llama_token * tokens, int32_t n_tokens, char * text,
                        int32_t text_len_max, bool remove_special, bool unparse_special, int32_t * result) {
    return guarded([&] { *result = llama_detokenize(vocab, tokens, n_tokens, text, text_len_max, remove_special, unparse_special); });
}

int llama_rs_vocab_get_text(const llama_vocab * vocab, llama_token token, const char ** result) {
    return guarded([&] { *result = llama_vocab_get_text(vocab, token); });
}

int llama_rs_vocab_get_score(const llama_vocab * vocab, llama_token token, float * result) {
    return guarded([&] { *result = llama_vocab_get_score(vocab, token); });
}

int llama_rs_vocab_get_attr(const llama_vocab * vocab, llama_token token, llama_token_attr * result) {
    return guarded([&] { *result = llama_vocab_get_attr(vocab, token); });
}

int llama_rs_chat_apply_template(const char * tmpl, const llama_chat_message * chat, size_t n_msg, bool add_ass,
                                 char * buf, int32_t length, int32_t * result) {
    return guarded([&] { *result = llama_chat_apply_template(tmpl, chat, n_msg, add_ass, buf, length); });
}

int llama_rs_sampler_init_grammar(const llama_vocab * vocab, const char * grammar_str, const char * grammar_root,
                                  llama_sampler ** result) {
    return guarded([&] { *result = llama_sampler_init_grammar(vocab, grammar_str, grammar_root); });
}

int llama_rs_sampler_init_grammar_lazy_patterns(const llama_vocab * vocab, const char * grammar_str,
                                                const char * grammar_root, const char ** trigger_patterns,
                                                size_t num_trigger_patterns, const llama_token * trigger_tokens,
                                                size_t num_trigger_tokens, llama_sampler ** result) {
    return guarded([&] {
        // llama.cpp allocates the sampler before it compiles the trigger
        // patterns, and leaks it when one of them throws (an invalid
        // regex). Compiled here first, the same way (std::regex, default
        // ECMAScript flags), an invalid pattern throws before anything is
        // allocated. llama.cpp compiles them only for a non-empty grammar.
        if (grammar_str != nullptr && grammar_str[0] != '\0') {
            for (size_t i = 0; i < num_trigger_patterns; ++i) {
                std::regex check(trigger_patterns[i]);
            }
        }
        *result = llama_sampler_init_grammar_lazy_patterns(vocab, grammar_str, grammar_root, trigger_patterns,
                                                           num_trigger_patterns, trigger_tokens, num_trigger_tokens);
    });
}

int llama_rs_sampler_accept(llama_sampler * smpl, llama_token token) {
    return guarded([&] { llama_sampler_accept(smpl, token); });
}

int llama_rs_sampler_apply(llama_sampler * smpl, llama_token_data_array * cur_p) {
    return guarded([&] { llama_sampler_apply(smpl, cur_p); });
}

int llama_rs_sampler_sample(llama_sampler * smpl, llama_context * ctx, int32_t idx, llama_token * result) {
    return guarded([&] { *result = llama_sampler_sample(smpl, ctx, idx); });
}

int llama_rs_model_save_to_file(const llama_model * model, const char * path_model) {
    return guarded([&] { llama_model_save_to_file(model, path_model); });
}

int llama_rs_load_mode_from_str(const char * str, llama_load_mode * result) {
    return guarded([&] { *result = llama_load_mode_from_str(str); });
}

int llama_rs_state_seq_set_data_ext(llama_context * ctx, const uint8_t * src, size_t size, llama_seq_id dest_seq_id,
                                    llama_state_seq_flags flags, size_t * result) {
    return guarded([&] { *result = llama_state_seq_set_data_ext(ctx, src, size, dest_seq_id, flags); });
}

int llama_rs_set_adapters_lora(llama_context * ctx, llama_adapter_lora ** adapters, size_t n_adapters, float * scales,
                               int32_t * result) {
    return guarded([&] { *result = llama_set_adapters_lora(ctx, adapters, n_adapters, scales); });
}

// One buffer type's share of a context's memory, as llama_get_memory_breakdown
// reports it (a std::map there, a plain array here).
struct llama_rs_buffer_memory {
    ggml_backend_buffer_type_t buft;
    size_t model;
    size_t context;
    size_t compute;
};

// Writes at most `capacity` entries of the context's memory breakdown to
// `out` and the number of entries there are to `*count` (call again with a
// larger array when it exceeds `capacity`). For a context of a model loaded
// with no_alloc these are the sizes llama.cpp would allocate.
// `ggml_backend_dev_buffer_type(dev)` behind the barrier: for ggml-vulkan
// this initializes the device (ggml_vk_get_device, which throws when a
// device cannot be set up).
int llama_rs_dev_buffer_type(ggml_backend_dev_t dev, ggml_backend_buffer_type_t * result) {
    return guarded([&] { *result = ggml_backend_dev_buffer_type(dev); });
}

int llama_rs_get_memory_breakdown(const llama_context * ctx, llama_rs_buffer_memory * out, size_t capacity,
                                  size_t * count) {
    return guarded([&] {
        const llama_memory_breakdown breakdown = llama_get_memory_breakdown(ctx);
        *count = breakdown.size();
        size_t i = 0;
        for (const auto & [buft, mb] : breakdown) {
            if (i == capacity) {
                break;
            }
            out[i++] = llama_rs_buffer_memory{buft, mb.model, mb.context, mb.compute};
        }
    });
}

} // extern "C"

// ---------------------------------------------------------------------------
// The RPC guard. ggml-rpc's client calls GGML_ABORT when a send or receive
// to a worker fails: on the dispatcher thread of that worker's connection
// (a worker that died while a call used it), or on the thread opening a
// connection (connect, handshake). The hook below changes the first, while
// a guarded call is in flight, into the end of that dispatcher thread
// alone: the call waiting for it never completes, and the Rust side
// (llamacpp/src/llama/rpc/guard.rs) stops waiting for the thread it ran the call on and
// leaks what the call holds. On a guarded thread where a C++ catch lies
// between the hook and the guard (llama_decode in the shim, model loading,
// context creation), the second becomes an exception. Every other abort
// goes on as before.
//
// A thread is guarded between llama_rs_rpc_guard_begin and _end, and only
// the Rust side's call threads are. Connections are only ever opened on
// guarded threads, so an unguarded thread that reports a failed RPC send
// or receive is a dispatcher thread.

#if LLAMA_RS_RPC_GUARD
namespace {

std::atomic<int> rpc_guarded_calls{0};
std::atomic<unsigned long long> rpc_failures{0};
ggml_abort_callback_t previous_abort = nullptr;
// 0: not guarded; 1: guarded; 2: guarded, and a C++ catch is on the stack.
thread_local int rpc_guard = 0;

bool contains(const char * message, const char * text) {
    return message != nullptr && std::strstr(message, text) != nullptr;
}

void rpc_abort_hook(const char * message) {
    const bool lost = contains(message, "Remote RPC server crashed");
    const bool connect = contains(message, "Failed to connect to") || contains(message, "RPC handshake failed");
    if ((lost || connect) && rpc_guard == 2) {
        throw std::runtime_error(message);
    }
    if (lost && rpc_guard == 0 && rpc_guarded_calls.load() > 0) {
        rpc_failures.fetch_add(1);
        pthread_exit(nullptr);
    }
    if (previous_abort != nullptr) {
        previous_abort(message);
    } else {
        std::fprintf(stderr, "%s\n", message);
    }
}

} // namespace
#endif

extern "C" {

// Installs the abort hook once; returns 0, or -1 where there is no guard
// (then nothing below guards anything).
int llama_rs_rpc_guard_install(void) {
#if LLAMA_RS_RPC_GUARD
    static std::once_flag once;
    std::call_once(once, [] { previous_abort = ggml_set_abort_callback(rpc_abort_hook); });
    return 0;
#else
    return -1;
#endif
}

// Marks this thread as making a guarded call (`catches`: a C++ catch lies
// between the hook and the guard, so a failed connect may throw).
void llama_rs_rpc_guard_begin(bool catches) {
#if LLAMA_RS_RPC_GUARD
    rpc_guard = catches ? 2 : 1;
    rpc_guarded_calls.fetch_add(1);
#else
    (void) catches;
#endif
}

// Ends the guarded call begun on this thread.
void llama_rs_rpc_guard_end(void) {
#if LLAMA_RS_RPC_GUARD
    rpc_guard = 0;
    rpc_guarded_calls.fetch_sub(1);
#endif
}

// Counts out a guarded call whose thread will never get to _end (its
// worker died): from another thread.
void llama_rs_rpc_guard_abandon(void) {
#if LLAMA_RS_RPC_GUARD
    rpc_guarded_calls.fetch_sub(1);
#endif
}

// How many dispatcher threads the guard has ended (process-wide).
unsigned long long llama_rs_rpc_failures(void) {
#if LLAMA_RS_RPC_GUARD
    return rpc_failures.load();
#else
    return 0;
#endif
}

// llama_decode with a catch, synchronized before it returns: the RPC
// backend computes asynchronously, and the wait for its results (which
// reading the logits would do, unguarded) belongs inside. Called on a
// thread the caller has guarded with `catches` (llamacpp/src/llama/rpc/guard.rs: one
// begin/end pair per call, so the count of guarded calls stays exact when
// a call is abandoned).
int llama_rs_rpc_decode(llama_context * ctx, llama_batch batch, int32_t * result) {
    return guarded([&] {
        *result = llama_decode(ctx, batch);
        llama_synchronize(ctx);
    });
}

// llama_encode likewise.
int llama_rs_rpc_encode(llama_context * ctx, llama_batch batch, int32_t * result) {
    return guarded([&] {
        *result = llama_encode(ctx, batch);
        llama_synchronize(ctx);
    });
}

#ifdef LLAMA_RS_MTMD
// libmtmd (feature `mtmd`): the calls whose C++ inside can throw (loading a
// projector, decoding media files, tokenizing, encoding, evaluating).
// Failures that are not exceptions keep mtmd's own return values.

int llama_rs_mtmd_init(const char * path, const llama_model * model, bool use_gpu, int32_t n_threads, bool warmup,
                       int32_t flash_attn_type, int32_t image_min_tokens, int32_t image_max_tokens,
                       mtmd_context ** result) {
    return guarded([&] {
        mtmd_context_params params = mtmd_context_params_default();
        params.use_gpu = use_gpu;
        params.print_timings = false;
        params.n_threads = n_threads;
        params.warmup = warmup;
        params.flash_attn_type = (enum llama_flash_attn_type) flash_attn_type;
        params.image_min_tokens = image_min_tokens;
        params.image_max_tokens = image_max_tokens;
        *result = mtmd_init_from_file(path, model, params);
    });
}

int llama_rs_mtmd_bitmap_init(uint32_t nx, uint32_t ny, const unsigned char * data, mtmd_bitmap ** result) {
    return guarded([&] { *result = mtmd_bitmap_init(nx, ny, data); });
}

int llama_rs_mtmd_bitmap_init_from_audio(size_t n_samples, const float * data, mtmd_bitmap ** result) {
    return guarded([&] { *result = mtmd_bitmap_init_from_audio(n_samples, data); });
}

int llama_rs_mtmd_bitmap_set_id(mtmd_bitmap * bitmap, const char * id) {
    return guarded([&] { mtmd_bitmap_set_id(bitmap, id); });
}

// An image (stb_image: jpg, png, bmp, gif, ...) or audio file (miniaudio:
// wav, mp3, flac) in memory, with its SHA-256 as the bitmap's id; never a
// video (the build has none).
int llama_rs_mtmd_bitmap_from_buf(const mtmd_context * ctx, const unsigned char * buf, size_t len,
                                  mtmd_bitmap ** result) {
    return guarded([&] {
        mtmd_helper_bitmap_wrapper wrapped =
            mtmd_helper_bitmap_init_from_buf(ctx, buf, len, false, mtmd_helper_init_opt_default());
        if (wrapped.video_ctx != nullptr) {
            mtmd_helper_video_free(wrapped.video_ctx);
            if (wrapped.bitmap != nullptr) {
                mtmd_bitmap_free(wrapped.bitmap);
            }
            wrapped.bitmap = nullptr;
        }
        *result = wrapped.bitmap;
    });
}

int llama_rs_mtmd_tokenize(const mtmd_context * ctx, mtmd_input_chunks * output, const char * text, size_t text_len,
                           bool add_special, bool parse_special, const mtmd_bitmap * const * bitmaps,
                           size_t n_bitmaps, int32_t * result) {
    return guarded([&] {
        // mtmd_tokenize reads `text` as a C string; the caller passes one
        // that ends at text_len (no interior NUL).
        mtmd_input_text input = {text, text_len, add_special, parse_special};
        *result = mtmd_tokenize(ctx, output, &input, bitmaps, n_bitmaps);
    });
}

int llama_rs_mtmd_encode_chunk(mtmd_context * ctx, const mtmd_input_chunk * chunk, int32_t * result) {
    return guarded([&] { *result = mtmd_encode_chunk(ctx, chunk); });
}

int llama_rs_mtmd_eval_chunk_single(mtmd_context * ctx, llama_context * lctx, const mtmd_input_chunk * chunk,
                                    llama_pos n_past, llama_seq_id seq_id, int32_t n_batch, bool logits_last,
                                    llama_pos * new_n_past, int32_t * result) {
    return guarded([&] {
        *result = mtmd_helper_eval_chunk_single(ctx, lctx, chunk, n_past, seq_id, n_batch, logits_last, new_n_past);
    });
}

// The embeddings of a media chunk already encoded by llama_rs_mtmd_encode_chunk
// (mtmd_get_output_embd), decoded into lctx at n_past.
int llama_rs_mtmd_decode_media_chunk(mtmd_context * ctx, llama_context * lctx, const mtmd_input_chunk * chunk,
                                     float * embd, llama_pos n_past, llama_seq_id seq_id, int32_t n_batch,
                                     llama_pos * new_n_past, int32_t * result) {
    return guarded([&] {
        *result = mtmd_helper_decode_image_chunk(ctx, lctx, chunk, embd, n_past, seq_id, n_batch, new_n_past,
                                                 nullptr, nullptr);
    });
}
#endif // LLAMA_RS_MTMD

} // extern "C"
