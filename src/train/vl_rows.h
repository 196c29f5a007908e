// The images of data rows (GRPO prompts, SFT samples), in verl's and EasyR1's layout: a row's image list
// (`images`: files relative to the data file, {"path": ...}, or a Parquet row's {"bytes": ...}), each standing
// where the text has an "<image>"; or chat messages whose content is a list of parts ({"type": "image",
// "image": path}). The text gets VL_IMAGE_TEXT in each image's place; once tokenized, each image's one pad
// becomes its grid's merged units (vl_expand_pads).
#pragma once
#include <cjson/cJSON.h>

#include "io/records.h"
#include "model/vl.h"

// The row's image list (key; NULL: none) into *ims (malloc'd; NULL when none), *n.
void vl_row_images(const cJSON *row, const RecordReader *r, const char *key, VlImage **ims, int *n);
// s with each "<image>" replaced by VL_IMAGE_TEXT (malloc'd); *count += how many there were.
char *vl_expand_placeholders(const char *s, int *count);
// A copy of a message list (the caller cJSON_Deletes it) ready for the chat template: content parts
// flattened (their images appended to *ims, *n) and "<image>" placeholders expanded; *placeholders += the
// images the text now stands for. Dies naming r's row and key on a part it does not understand.
cJSON *vl_row_messages(const cJSON *msgs, const RecordReader *r, const char *key, VlImage **ims, int *n,
                       int *placeholders);
// The tokenized ids of a row with n images: each image's grid read (vl: the model's processor; NULL for a
// text model, which dies), and its pad expanded. Dies naming the row when the placeholders are not n.
void vl_row_expand(const RecordReader *r, const VlProcessor *vl, int32_t image_pad, VlImage *ims, int n,
                   int placeholders, IdList *ids);
