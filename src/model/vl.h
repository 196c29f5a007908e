// A Qwen2.5-VL model's image side, as the commands use it: the frozen vision tower and the image processor
// of a model directory, images (a file, or encoded bytes as a dataset row holds them) to their grids and
// features, and the chat side: an image stands in a message as <|vision_start|><|image_pad|><|vision_end|>,
// whose one pad becomes the image's t*h*w / merge^2 pads once the text is tokenized (as transformers'
// processor expands it).
#pragma once
#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

#include "model/decoder.h"
#include "model/vision.h"
#include "model/vl_processor.h"
#include "text/tokenizer.h"

#define VL_IMAGE_TEXT "<|vision_start|><|image_pad|><|vision_end|>"  // one image in a message's text

typedef struct {
    Vision vision;
    VlProcessor proc;
    const Backend *be;  // where the tower and its merger run: the CPU
} VlModel;

// DIR's vision tower (config.json's vision_config, visual.* weights) and preprocessor_config.json, checked
// against the language model's config c (its hidden width).
void vl_model_load(VlModel *v, const char *dir, const DecoderConfig *c);
void vl_model_free(VlModel *v);
// The processor's resize bounds set by the user (data.min_pixels / data.max_pixels, --min-pixels / --max-pixels;
// 0 keeps preprocessor_config.json's); dies naming `what` when min exceeds max.
void vl_set_pixels(VlProcessor *p, int64_t min_pixels, int64_t max_pixels, const char *what);

// c's parameter slab with the patch merger of tower vc in it (a trained merger: DecoderConfig.merger_*), or
// without (vc NULL).
void vl_config_merger(DecoderConfig *c, const VisionConfig *vc);

// Qwen2.5-VL shapes for `grpo init`: "qwen2.5-vl-tiny" (the tiny text preset's language model, a 2-block tower
// of width 32), "qwen2.5-vl-3b", "qwen2.5-vl-7b" (the published configs). Returns 0 for another name.
int vl_preset(const char *name, DecoderConfig *c, VisionConfig *vc);
const char *vl_preset_names(void);
// DIR as a Qwen2.5-VL checkpoint of random weights (Hugging Face's initialisation, c->init_std): the language
// model c and tower vc in model.safetensors (transformers 4's names; weights in dtype), config.json with
// vision_start / image / vision_end ids `vision` and preprocessor_config.json (min_pixels 56 x 56, max_pixels).
void vl_write_random(const char *dir, const DecoderConfig *c, const VisionConfig *vc, const int32_t vision[3],
                     int64_t max_pixels, uint64_t seed, DType dtype);

// One image of a prompt: a file, or its encoded bytes (a Parquet row's {"bytes": ...}).
typedef struct {
    char *path;      // the file, or a name for messages when bytes are given (malloc'd)
    uint8_t *bytes;  // NULL: read path
    size_t n;
    int grid[3];     // t, h, w in patches, after smart_resize
} VlImage;

// im's grid (decoding it once); dies naming `where` on a bad image. _try: NULL, or what is wrong with the image
// (malloc'd, naming it); a file it cannot read still dies. full 0 reads only the header of an image given as bytes
// (a server's quick look: a corrupt body shows when it is decoded).
void vl_image_grid(const VlProcessor *p, VlImage *im, const char *where);
char *vl_image_grid_try(const VlProcessor *p, VlImage *im, int full);
// Every image's features of one prompt, concatenated in order: t*h*w / merge^2 rows of the language model's
// width per image (malloc'd; NULL for none).
float *vl_prompt_features(const VlModel *v, const VlImage *ims, int n, const char *where);
// The same images' merger input (vision_hidden, concatenated; malloc'd, NULL for none); *units its rows. The
// merger works on each row alone: vision_merge of it is vl_prompt_features.
float *vl_prompt_hidden(const VlModel *v, const VlImage *ims, int n, const char *where, int64_t *units);
void vl_image_free(VlImage *im);
// The pads of the images' merged units: t*h*w / merge^2.
int64_t vl_image_units(const int grid[3], int merge);

// decoder_vl_inputs of a packed batch whose sequence b has the n_images[b] images ims[b] (their grids) and their
// features feats[b] in its first prompt_len[b] rows (NULL: all). Returns 0, or -1 when pads and images differ.
int vl_batch_inputs(const Decoder *m, const int32_t *tokens, const int64_t *seq_off, int B, const int64_t *prompt_len,
                    const VlImage *const *ims, const int *n_images, const float *const *feats, int merge,
                    DecoderVlInputs *in);

// in->image_grads (decoder_backward's) of a batch (sequences seq_off) whose sequence b took its features from
// feats[b] (vl_batch_inputs): each image row's gradient goes to the same place of grads[b].
void vl_inputs_grads(DecoderVlInputs *in, const int64_t *seq_off, const float *const *feats, float *const *grads);

// A prompt's own image inputs (the rollout's RolloutPrompt.vl): ids (n) with its images and their features;
// in when it has images, else NULL (a text prompt). Dies when its pads and images differ.
const DecoderVlInputs *vl_prompt_inputs(const Decoder *m, const int32_t *ids, int64_t n, const VlImage *ims,
                                      int n_images, const float *feats, int merge, DecoderVlInputs *in);

// ids (n) with each image_pad token expanded to its image's pads, in order, into *out (a fresh list).
// Returns 0, or -1 when the ids hold another number of image_pad tokens than n_images.
int vl_expand_pads(const int32_t *ids, int64_t n, int32_t image_pad, const VlImage *ims, int n_images, int merge,
                   IdList *out);

// A chat request's messages whose contents may hold image parts (vl_message_images' forms), as ids: the
// chat template's rendering (add_generation_prompt: with the assistant's opening; tools: the request's, or
// NULL), tokenized, each image's pad expanded to its grid's units (vl: the model's processor; NULL for a text
// model, which refuses image parts). *ims, *n_images: the images (malloc'd; NULL and 0 when none). Dies naming
// `where` on a bad message, part or image.
void vl_render_messages(const VlProcessor *vl, int32_t image_pad, Tokenizer *tok, const cJSON *msgs,
                        const cJSON *tools, uint32_t nul, int add_generation_prompt, IdList *ids, VlImage **ims,
                        int *n_images, const char *where);
// The tokenized rendering *ids of messages holding the n_images images ims (vl_message_images'): each image's
// grid read (full: vl_image_grid_try's), its pad expanded (vl NULL: a text model, which takes no image). NULL, or
// what is wrong (malloc'd).
char *vl_expand_images(const VlProcessor *vl, int32_t image_pad, VlImage *ims, int n_images, int full,
                       IdList *ids);

// A message list whose contents may be lists of parts ({"type": "text", "text": ...}, {"type": "image",
// "image": SRC} or {"type": "image_url", "image_url": {"url": SRC}}): their images, in order, appended to *ims
// (*n of them). SRC: a data: URL (base64: "data:image/png;base64,...", its bytes kept, named by its message
// and part), or with files a path or file:// URL (a server passes files 0: it reads no file a client names).
// The chat template renders the parts (text/chat.h; VL_IMAGE_TEXT for each image where a template joins
// parts). Returns NULL, or a message (malloc'd) naming the message and part not understood.
char *vl_message_images(const cJSON *msgs, int files, VlImage **ims, int *n);
