import { byId } from './dom.js';

let toastTimer: number | undefined;

/** A message at the bottom of the page for five seconds (an error in red). */
export function toast(message: string, isError = false): void {
  const el = byId('toast');
  el.textContent = message;
  el.className = `show${isError ? ' error' : ''}`;
  clearTimeout(toastTimer);
  toastTimer = setTimeout(() => {
    el.className = '';
  }, 5000);
}

/** The shell's confirmation dialog; true when the operator pressed Confirm. */
export function confirmDialog(text: string): Promise<boolean> {
  const dialog = byId('confirm');
  if (!(dialog instanceof HTMLDialogElement)) throw new Error('#confirm is not a <dialog>');
  byId('confirm-text').textContent = text;
  return new Promise((resolve) => {
    dialog.returnValue = '';
    dialog.addEventListener('close', function onClose() {
      dialog.removeEventListener('close', onClose);
      resolve(dialog.returnValue === 'ok');
    });
    dialog.showModal();
  });
}
