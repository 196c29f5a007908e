// Image decoding and Pillow's bicubic resize (image.h).
#include "io/image.h"

#include <stdio.h>  // before jpeglib.h, which uses FILE
#include <jpeglib.h>
#include <jerror.h>  // JWRN_JPEG_EOF
#include <math.h>
#include <png.h>
#include <setjmp.h>
#include <stdlib.h>
#include <string.h>
#include <webp/decode.h>

#include "base/util.h"

typedef struct {
    int64_t max_pixels;
    char *err;  // what is wrong (malloc'd), once a decoder returned -1
} Ctx;

// -1, with why kept in c->err.
static int bad(Ctx *c, const char *why) {
    c->err = xstrdup(why);
    return -1;
}

static int check_size(Ctx *c, int64_t w, int64_t h) {
    if (w <= 0 || h <= 0) return bad(c, "an image without pixels");
    if (w <= c->max_pixels / h) return 0;
    c->err = xprintf("%lld x %lld pixels, over the cap of %lld (a decompression bomb?)", (long long)w,
                     (long long)h, (long long)c->max_pixels);
    return -1;
}

// ---------------------------------------------------------------- PNG
typedef struct {
    const uint8_t *p;
    size_t n, at;
    char error[128];
} PngSrc;

static void png_read_mem(png_structp png, png_bytep out, png_size_t n) {
    PngSrc *s = png_get_io_ptr(png);
    if (n > s->n - s->at) png_error(png, "the file is truncated");
    memcpy(out, s->p + s->at, n);
    s->at += n;
}

static void png_on_error(png_structp png, png_const_charp msg) {
    PngSrc *s = png_get_error_ptr(png);
    snprintf(s->error, sizeof s->error, "corrupt PNG (%s)", msg);
    png_longjmp(png, 1);
}

static void png_on_warning(png_structp png, png_const_charp msg) { (void)png, (void)msg; }

static int decode_png(Image *im, const uint8_t *data, size_t n, Ctx *c) {
    PngSrc src = {data, n, 0, ""};
    png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &src, png_on_error, png_on_warning);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    if (!info) die("out of memory (libpng)");
    uint8_t *volatile pixels = NULL;
    png_bytep *volatile rows = NULL;
    if (setjmp(png_jmpbuf(png))) {
        free(pixels);
        free(rows);
        png_destroy_read_struct(&png, &info, NULL);
        if (!c->err) bad(c, src.error[0] ? src.error : "corrupt PNG");  // a size refused: c->err says it
        return -1;
    }
    png_set_read_fn(png, &src, png_read_mem);
    png_set_user_limits(png, 1 << 24, 1 << 24);
    png_read_info(png, info);
    png_uint_32 w = png_get_image_width(png, info), h = png_get_image_height(png, info);
    int type = png_get_color_type(png, info), depth = png_get_bit_depth(png, info);
    if (check_size(c, w, h)) png_error(png, c->err);
    // Pillow's modes: a palette is looked up (tRNS ignored), grey below 8 bits scaled up, 16 bits keep their
    // high byte, grey and alpha become RGB and lose the alpha; but 16-bit grey is Pillow's mode I, whose
    // conversion to RGB clamps each value to 255.
    int grey16 = type == PNG_COLOR_TYPE_GRAY && depth == 16;
    if (type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
    if (type == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
    if (depth == 16 && !grey16) png_set_strip_16(png);
    png_set_strip_alpha(png);  // also the alpha libpng makes of a palette's tRNS
    if (!grey16 && (type == PNG_COLOR_TYPE_GRAY || type == PNG_COLOR_TYPE_GRAY_ALPHA)) png_set_gray_to_rgb(png);
    png_set_interlace_handling(png);
    png_read_update_info(png, info);
    if (png_get_rowbytes(png, info) != (size_t)w * (grey16 ? 2 : 3)) png_error(png, "unexpected row layout");
    pixels = xmalloc((size_t)w * h * 3);
    rows = xmalloc(h * sizeof *rows);
    for (png_uint_32 y = 0; y < h; y++) rows[y] = pixels + (size_t)y * w * 3;  // 2 bytes a pixel fit too
    png_read_image(png, rows);  // no png_read_end: Pillow takes a file that stops after its image data
    png_destroy_read_struct(&png, &info, NULL);
    free(rows);
    for (png_uint_32 y = 0; grey16 && y < h; y++) {  // big-endian 16-bit grey -> RGB, clamped, from the row's end
        uint8_t *row = pixels + (size_t)y * w * 3;
        for (png_uint_32 x = w; x-- > 0;) {
            unsigned v = (unsigned)row[2 * x] << 8 | row[2 * x + 1];
            uint8_t g = v > 255 ? 255 : (uint8_t)v;
            row[3 * x] = g;
            row[3 * x + 1] = g;
            row[3 * x + 2] = g;
        }
    }
    *im = (Image){(int)w, (int)h, pixels};
    return 0;
}

// ---------------------------------------------------------------- JPEG
typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
    char error[JMSG_LENGTH_MAX];
    int truncated;  // libjpeg warned that the data ended early (it fills in grey; Pillow refuses the file)
} JpegErr;

#define JPEG_MAX_SCANS 1000  // a progressive file may hold many scans; thousands only burn time

// Warnings: only premature end of data counts (other corrupt-data warnings Pillow lets pass too).
static void jpeg_on_message(j_common_ptr cinfo, int level) {
    JpegErr *e = (JpegErr *)cinfo->err;
    if (level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF) e->truncated = 1;
}

static void jpeg_on_progress(j_common_ptr cinfo) {
    if (((j_decompress_ptr)cinfo)->input_scan_number <= JPEG_MAX_SCANS) return;
    JpegErr *e = (JpegErr *)cinfo->err;
    snprintf(e->error, sizeof e->error, "over %d progressive scans", JPEG_MAX_SCANS);
    longjmp(e->jump, 1);
}

static void jpeg_on_error(j_common_ptr cinfo) {
    JpegErr *e = (JpegErr *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, e->error);
    longjmp(e->jump, 1);
}

static void jpeg_no_output(j_common_ptr cinfo) { (void)cinfo; }

static int decode_jpeg(Image *im, const uint8_t *data, size_t n, Ctx *c) {
    struct jpeg_decompress_struct cinfo;
    JpegErr err;
    cinfo.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = jpeg_on_error;
    err.pub.output_message = jpeg_no_output;
    err.pub.emit_message = jpeg_on_message;
    err.truncated = 0;
    struct jpeg_progress_mgr progress = {.progress_monitor = jpeg_on_progress};
    uint8_t *volatile pixels = NULL;
    if (setjmp(err.jump)) {
        free(pixels);
        jpeg_destroy_decompress(&cinfo);
        if (!c->err) c->err = xprintf("corrupt JPEG (%s)", err.error);
        return -1;
    }
    jpeg_create_decompress(&cinfo);
    cinfo.progress = &progress;
    jpeg_mem_src(&cinfo, data, (unsigned long)n);
    jpeg_read_header(&cinfo, TRUE);
    if (check_size(c, cinfo.image_width, cinfo.image_height) == 0 &&
        (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK))
        bad(c, "a CMYK JPEG (convert it to RGB)");
    if (c->err) longjmp(err.jump, 1);
    cinfo.out_color_space = JCS_RGB;  // grey and YCbCr alike: Pillow's L and YCbCr -> RGB agree with libjpeg's
    jpeg_start_decompress(&cinfo);
    size_t w = cinfo.output_width, h = cinfo.output_height;
    pixels = xmalloc(w * h * 3);
    while (cinfo.output_scanline < cinfo.output_height) {
        JSAMPROW row = pixels + (size_t)cinfo.output_scanline * w * 3;
        jpeg_read_scanlines(&cinfo, &row, 1);
    }
    jpeg_finish_decompress(&cinfo);
    jpeg_destroy_decompress(&cinfo);
    if (err.truncated) {
        free(pixels);
        return bad(c, "a truncated JPEG");
    }
    *im = (Image){(int)w, (int)h, pixels};
    return 0;
}

// ---------------------------------------------------------------- WebP
static int decode_webp(Image *im, const uint8_t *data, size_t n, Ctx *c) {
    WebPBitstreamFeatures f;
    if (WebPGetFeatures(data, n, &f) != VP8_STATUS_OK) return bad(c, "corrupt WebP (no header)");
    if (f.has_animation) return bad(c, "an animated WebP");
    if (check_size(c, f.width, f.height)) return -1;
    int w, h;
    uint8_t *got = WebPDecodeRGB(data, n, &w, &h);
    if (!got) return bad(c, "corrupt WebP");
    uint8_t *pixels = xmalloc((size_t)w * h * 3);
    memcpy(pixels, got, (size_t)w * h * 3);
    WebPFree(got);
    *im = (Image){w, h, pixels};
    return 0;
}

// A JPEG's size from its header (libjpeg reads the markers up to the first scan). 0, or -1 with c->err.
static int jpeg_size(const uint8_t *data, size_t n, Ctx *c, int *w, int *h) {
    struct jpeg_decompress_struct cinfo;
    JpegErr err;
    cinfo.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = jpeg_on_error;
    err.pub.output_message = jpeg_no_output;
    if (setjmp(err.jump)) {
        jpeg_destroy_decompress(&cinfo);
        c->err = xprintf("corrupt JPEG (%s)", err.error);
        return -1;
    }
    jpeg_create_decompress(&cinfo);
    jpeg_mem_src(&cinfo, data, (unsigned long)n);
    jpeg_read_header(&cinfo, TRUE);
    *w = (int)cinfo.image_width;
    *h = (int)cinfo.image_height;
    jpeg_destroy_decompress(&cinfo);
    return 0;
}

static const uint8_t png_magic[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};

char *image_size_try(const uint8_t *data, size_t n, int64_t max_pixels, int *w, int *h) {
    Ctx c = {max_pixels, NULL};
    WebPBitstreamFeatures f;
    int64_t pw = 0, ph = 0;
    if (n >= 8 && memcmp(data, png_magic, 8) == 0) {
        if (n < 24 || memcmp(data + 12, "IHDR", 4) != 0) return xstrdup("corrupt PNG (no IHDR chunk first)");
        pw = (int64_t)data[16] << 24 | data[17] << 16 | data[18] << 8 | data[19];
        ph = (int64_t)data[20] << 24 | data[21] << 16 | data[22] << 8 | data[23];
    } else if (n >= 3 && data[0] == 0xFF && data[1] == 0xD8 && data[2] == 0xFF) {
        int jw, jh;
        if (jpeg_size(data, n, &c, &jw, &jh)) return c.err;
        pw = jw;
        ph = jh;
    } else if (n >= 12 && memcmp(data, "RIFF", 4) == 0 && memcmp(data + 8, "WEBP", 4) == 0) {
        if (WebPGetFeatures(data, n, &f) != VP8_STATUS_OK) return xstrdup("corrupt WebP (no header)");
        pw = f.width;
        ph = f.height;
    } else {
        return xstrdup("not a PNG, JPEG or WebP image");
    }
    if (check_size(&c, pw, ph)) return c.err;
    *w = (int)pw;
    *h = (int)ph;
    return NULL;
}

char *image_decode_try(Image *im, const uint8_t *data, size_t n, int64_t max_pixels) {
    Ctx c = {max_pixels, NULL};
    memset(im, 0, sizeof *im);
    if (n >= 8 && memcmp(data, png_magic, 8) == 0) decode_png(im, data, n, &c);
    else if (n >= 3 && data[0] == 0xFF && data[1] == 0xD8 && data[2] == 0xFF) decode_jpeg(im, data, n, &c);
    else if (n >= 12 && memcmp(data, "RIFF", 4) == 0 && memcmp(data + 8, "WEBP", 4) == 0)
        decode_webp(im, data, n, &c);
    else bad(&c, "not a PNG, JPEG or WebP image");
    return c.err;
}

void image_decode(Image *im, const uint8_t *data, size_t n, const char *name, int64_t max_pixels,
                  const char *where) {
    char *err = image_decode_try(im, data, n, max_pixels);
    if (err) die("%s: %s: %s", where, name, err);
}

char *image_load_try(Image *im, const char *path, int64_t max_pixels) {
    size_t n;
    // a compressed image is smaller than its pixels: the file cap follows the pixel cap
    int64_t cap = max_pixels > (INT64_C(1) << 40) ? INT64_C(1) << 40 : max_pixels;
    char *data = file_read_all(path, (size_t)cap * 4 + 4096, &n);
    char *err = image_decode_try(im, (const uint8_t *)data, n, max_pixels);
    free(data);
    return err;
}

void image_load(Image *im, const char *path, int64_t max_pixels, const char *where) {
    char *err = image_load_try(im, path, max_pixels);
    if (err) die("%s: %s: %s", where, path, err);
}

void image_free(Image *im) {
    free(im->rgb);
    memset(im, 0, sizeof *im);
}

// ---------------------------------------------------------------- Pillow's resample

static double bicubic(double x) {
    const double a = -0.5;
    if (x < 0.0) x = -x;
    if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
    if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
    return 0.0;
}

int image_bicubic_coeffs(int in_size, int out_size, int **bounds_out, int32_t **kk_out) {
    double scale = (double)(float)in_size / out_size, filterscale = scale < 1.0 ? 1.0 : scale;
    double support = 2.0 * filterscale;
    int ksize = (int)ceil(support) * 2 + 1;
    int *bounds = xmalloc((size_t)out_size * 2 * sizeof *bounds);
    int32_t *kk = xmalloc((size_t)out_size * (size_t)ksize * sizeof *kk);
    double *k = xmalloc((size_t)ksize * sizeof *k);
    for (int xx = 0; xx < out_size; xx++) {
        double center = (xx + 0.5) * scale, ww = 0.0, ss = 1.0 / filterscale;
        int xmin = (int)(center - support + 0.5);
        if (xmin < 0) xmin = 0;
        int xmax = (int)(center + support + 0.5);
        if (xmax > in_size) xmax = in_size;
        xmax -= xmin;
        for (int x = 0; x < xmax; x++) {
            double w = bicubic((x + xmin - center + 0.5) * ss);
            k[x] = w;
            ww += w;
        }
        for (int x = 0; x < ksize; x++) {
            double v = 0.0;
            if (x < xmax) v = ww != 0.0 ? k[x] / ww : k[x];
            kk[(size_t)xx * ksize + x] = v < 0 ? (int32_t)(-0.5 + v * (1 << IMAGE_PRECISION_BITS))
                                               : (int32_t)(0.5 + v * (1 << IMAGE_PRECISION_BITS));
        }
        bounds[2 * xx] = xmin;
        bounds[2 * xx + 1] = xmax;
    }
    free(k);
    *bounds_out = bounds;
    *kk_out = kk;
    return ksize;
}

static uint8_t clip8(int32_t ss) {
    int32_t v = ss >> IMAGE_PRECISION_BITS;  // arithmetic shift, as Pillow's (gcc and clang)
    if (v < 0) return 0;
    return v > 255 ? 255 : (uint8_t)v;
}

// One output pixel of a pass: n input pixels `stride` bytes apart from p, weighted by k, rounded (Pillow's
// ImagingResampleHorizontal_8bpc / Vertical_8bpc).
static void convolve(const uint8_t *p, size_t stride, const int32_t *k, int n, uint8_t *o) {
    int32_t s0 = 1 << (IMAGE_PRECISION_BITS - 1), s1 = s0, s2 = s0;
    for (int x = 0; x < n; x++, p += stride) {
        s0 += p[0] * k[x];
        s1 += p[1] * k[x];
        s2 += p[2] * k[x];
    }
    o[0] = clip8(s0);
    o[1] = clip8(s1);
    o[2] = clip8(s2);
}

void image_resize_bicubic(const Image *in, int w, int h, Image *out) {
    int *bx, *by;
    int32_t *kx, *ky;
    int ksx = image_bicubic_coeffs(in->w, w, &bx, &kx), ksy = image_bicubic_coeffs(in->h, h, &by, &ky);
    int need_h = w != in->w, need_v = h != in->h;
    // the rows the vertical pass reads
    int y_first = by[0], y_last = by[2 * h - 2] + by[2 * h - 1];
    const uint8_t *src = in->rgb;
    uint8_t *tmp = NULL;
    if (need_h) {  // into rows y_first .. y_last of the input only
        for (int i = 0; i < h; i++) by[2 * i] -= y_first;
        int src_h = y_last - y_first;
        tmp = xmalloc((size_t)w * src_h * 3 + 1);
        for (int yy = 0; yy < src_h; yy++) {
            const uint8_t *row = in->rgb + (size_t)(yy + y_first) * in->w * 3;
            for (int xx = 0; xx < w; xx++)
                convolve(row + (size_t)bx[2 * xx] * 3, 3, kx + (size_t)xx * ksx, bx[2 * xx + 1],
                         tmp + ((size_t)yy * w + xx) * 3);
        }
        src = tmp;
    }
    int sw = need_h ? w : in->w;
    uint8_t *pixels = xmalloc((size_t)sw * h * 3 + 1);
    if (need_v) {
        for (int yy = 0; yy < h; yy++) {
            const int32_t *k = ky + (size_t)yy * ksy;
            for (int xx = 0; xx < sw; xx++)
                convolve(src + ((size_t)by[2 * yy] * sw + xx) * 3, (size_t)sw * 3, k, by[2 * yy + 1],
                         pixels + ((size_t)yy * sw + xx) * 3);
        }
    } else {
        memcpy(pixels, src, (size_t)sw * h * 3);
    }
    free(tmp);
    free(bx), free(by), free(kx), free(ky);
    *out = (Image){sw, h, pixels};
}

void image_save_png(const Image *im, const char *path) {
    png_image img = {.version = PNG_IMAGE_VERSION, .width = (png_uint_32)im->w, .height = (png_uint_32)im->h,
                     .format = PNG_FORMAT_RGB};
    png_alloc_size_t size = 0;
    if (!png_image_write_to_memory(&img, NULL, &size, 0, im->rgb, 0, NULL))
        die("cannot encode %s: %s", path, img.message);
    void *buf = xmalloc(size);
    if (!png_image_write_to_memory(&img, buf, &size, 0, im->rgb, 0, NULL))
        die("cannot encode %s: %s", path, img.message);
    AtomicFile af;
    atomic_file_open(&af, path);
    atomic_file_write(&af, buf, size);
    atomic_file_commit(&af);
    free(buf);
}
