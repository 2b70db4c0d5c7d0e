/* dlsym interposer entry (x86-64). glibc answers dlsym(RTLD_NEXT, ...) relative to the return
   address of its caller, so for RTLD_NEXT we tail-jump to glibc's dlsym with the original
   return address intact; every other handle goes to cmt_dlsym_dispatch (hooks.cpp). */
#if defined(__x86_64__)
    .text
    .globl  dlsym
    .type   dlsym, @function
dlsym:
    .cfi_startproc
    cmpq    $-1, %rdi
    jne     cmt_dlsym_dispatch
    movq    cmt_real_dlsym_ptr(%rip), %rax
    testq   %rax, %rax
    jz      1f
    jmp     *%rax
1:
    pushq   %rdi
    .cfi_adjust_cfa_offset 8
    pushq   %rsi
    .cfi_adjust_cfa_offset 8
    subq    $8, %rsp
    .cfi_adjust_cfa_offset 8
    call    cmt_find_real_dlsym
    addq    $8, %rsp
    .cfi_adjust_cfa_offset -8
    popq    %rsi
    .cfi_adjust_cfa_offset -8
    popq    %rdi
    .cfi_adjust_cfa_offset -8
    testq   %rax, %rax
    jz      2f
    jmp     *%rax
2:
    ret
    .cfi_endproc
    .size   dlsym, .-dlsym
#endif
    .section .note.GNU-stack,"",@progbits
