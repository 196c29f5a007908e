// Images for vision-language models: PNG, JPEG and WebP decoded with Debian's libraries (libpng,
// libjpeg-turbo, libwebp) into 8-bit RGB as Pillow gives them (`Image.open(path).convert("RGB")`: what
// transformers' Qwen2-VL image processor starts from), and Pillow's bicubic resize, to the pixel.
//
// Conversions to RGB, as Pillow's convert("RGB"): grey repeats its value, an alpha channel is dropped (not
// composited), a palette is looked up (its transparency ignored), 16-bit samples keep their high byte.
#pragma once
#include <stddef.h>
#include <stdint.h>

typedef struct {
    int w, h;
    uint8_t *rgb;  // h rows of w pixels, 3 bytes each (R, G, B)
} Image;

// Pillow's decompression-bomb limit (Image.MAX_IMAGE_PIXELS * 2), the default cap of image_load.
#define IMAGE_MAX_PIXELS ((int64_t)178956970)

// Decodes the file (its type from its first bytes). An image over max_pixels is refused from its header,
// before anything is decoded. Dies with "WHERE: PATH: why" on an unreadable, truncated, unknown or
// over-large image (where: the data file and line that named it, or the option).
void image_load(Image *im, const char *path, int64_t max_pixels, const char *where);
// The same from memory (name: for messages).
void image_decode(Image *im, const uint8_t *data, size_t n, const char *name, int64_t max_pixels,
                  const char *where);
// image_decode and image_load without dying on a bad image: NULL, or what is wrong with it (malloc'd; *im is
// then empty). image_load_try still dies on a file it cannot read.
char *image_decode_try(Image *im, const uint8_t *data, size_t n, int64_t max_pixels);
char *image_load_try(Image *im, const char *path, int64_t max_pixels);
// The image's width and height from its header alone (nothing decoded; a corrupt body is not noticed), the
// pixel cap checked: NULL, or what is wrong (malloc'd).
char *image_size_try(const uint8_t *data, size_t n, int64_t max_pixels, int *w, int *h);
void image_free(Image *im);
// im as an 8-bit RGB PNG file (written atomically; libpng's encoder).
void image_save_png(const Image *im, const char *path);

// Pillow's Image.resize((w, h), Image.BICUBIC) of an RGB image: separable convolution with the a = -0.5
// cubic, its support widened by the scale when shrinking (antialiasing), coefficients in 22-bit fixed point,
// the horizontal pass first into 8-bit rows, then the vertical one. out is allocated.
void image_resize_bicubic(const Image *in, int w, int h, Image *out);
// A pass of that resize, in_size -> out_size pixels along one axis: Pillow's precompute_coeffs (box
// 0..in_size) and normalize_coeffs_8bpc: per output pixel its first input pixel (bounds[2i]), their count
// (bounds[2i + 1]) and the returned ksize weights in fixed point (IMAGE_PRECISION_BITS: an output pixel is
// (2^(bits - 1) + sum of pixel * weight) >> bits, clipped to 0..255), malloc'd.
#define IMAGE_PRECISION_BITS (32 - 8 - 2)
int image_bicubic_coeffs(int in_size, int out_size, int **bounds, int32_t **kk);
