#include "text/chat.h"

#include <string.h>

static void turn(Buf *out, const char *role, const char *content, size_t len) {
    buf_append(out, "<|im_start|>", 12);
    buf_append(out, role, strlen(role));
    buf_append(out, "\n", 1);
    buf_append(out, content, len);
    buf_append(out, "<|im_end|>\n", 11);
}

int chat_render(const Tokenizer *t, const ChatMessage *msgs, int n, int add_generation_prompt, Buf *out, int *bad) {
    for (int i = 0; i < n; i++)
        if (strcmp(msgs[i].role, "system") && strcmp(msgs[i].role, "user") && strcmp(msgs[i].role, "assistant")) {
            *bad = i;
            return -1;
        }
    if (t->default_system && (n == 0 || strcmp(msgs[0].role, "system") != 0)) turn(out, "system", t->default_system, strlen(t->default_system));
    for (int i = 0; i < n; i++) turn(out, msgs[i].role, msgs[i].content, msgs[i].content_len);
    if (add_generation_prompt) buf_append(out, "<|im_start|>assistant\n", 22);
    if (!out->data) buf_append(out, "", 0);
    return 0;
}
